// What the grouped kernels share (TfraDeFindInitGroup, TfraDeApplyGradients):
// ops over N tables of one device whose per-table inputs arrive concatenated in
// one tensor each, so a parameter server receives one tensor per kind and step,
// not one per table.
#ifndef TFRA_DE_CC_OPS_DE_GROUPED_H_
#define TFRA_DE_CC_OPS_DE_GROUPED_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_kernel.h"
#include "de_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"

namespace tfra_de {

using TableRef = tensorflow::core::RefCountPtr<TableBase>;

// tables[i] (input i), checked to hold the op's key and value dtypes.
inline Status ResolveListedTable(OpKernelContext* ctx, int i, DataType key_dtype,
                                 DataType value_dtype, TableRef* table) {
  const Tensor& h = ctx->input(i);
  if (h.dtype() != tensorflow::DT_RESOURCE || h.NumElements() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("tables[", i, "] must be a scalar resource handle"));
  }
  TF_RETURN_IF_ERROR(tensorflow::LookupResource(ctx, h.flat<tensorflow::ResourceHandle>()(0), table));
  const TableConfig& cfg = (*table)->config();
  if (cfg.key_dtype != key_dtype || cfg.value_dtype != value_dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tables[", i, "] is ", tensorflow::DataTypeString(cfg.key_dtype), " -> ",
        tensorflow::DataTypeString(cfg.value_dtype), ", the op was built for ",
        tensorflow::DataTypeString(key_dtype), " -> ", tensorflow::DataTypeString(value_dtype)));
  }
  return absl::OkStatus();
}

// The counts input: one count >= 0 per table; *total = their sum.
inline Status ReadCounts(const Tensor& counts, int n, int64_t* total) {
  if (counts.dims() != 1 || counts.NumElements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "counts must have shape [N] = [", n, "], got ", counts.shape().DebugString()));
  }
  *total = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t c = counts.flat<int64_t>()(i);
    if (c < 0) {
      return absl::InvalidArgumentError(absl::StrCat("counts[", i, "] must be >= 0, got ", c));
    }
    *total += c;
  }
  return absl::OkStatus();
}

// `count` elements of flat `from` starting at `at`, copied into a new tensor of
// `shape` (a table op wants an aligned tensor of its own; the copy is small
// next to the table work).
inline Status CopyFlatSlice(OpKernelContext* ctx, const Tensor& from, int64_t at, int64_t count,
                            const std::vector<int64_t>& shape, Tensor* out) {
  TensorShape ts;
  TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape(shape, &ts));
  TF_RETURN_IF_ERROR(ctx->allocate_temp(from.dtype(), ts, out));
  if (from.dtype() == tensorflow::DT_STRING) {
    const auto src = from.flat<tensorflow::tstring>();
    auto dst = out->flat<tensorflow::tstring>();
    for (int64_t j = 0; j < count; ++j) dst(j) = src(at + j);
    return absl::OkStatus();
  }
  const size_t width = tensorflow::DataTypeSize(from.dtype());
  std::memcpy(const_cast<char*>(out->tensor_data().data()), from.tensor_data().data() + at * width,
              count * width);
  return absl::OkStatus();
}

inline InitSpec::Kind InitKindOf(const std::string& name) {
  if (name == "uniform") return InitSpec::kUniform;
  if (name == "normal") return InitSpec::kNormal;
  if (name == "truncated_normal") return InitSpec::kTruncatedNormal;
  return InitSpec::kConstant;
}

// The per-table initializers of attrs `inits`, `seeds`, `keyed` (one entry each
// per table; a, b and constant rows come at run time, in init_args).
inline Status ReadInitAttrs(OpKernelConstruction* c, int n, std::vector<InitSpec>* specs) {
  std::vector<std::string> inits;
  std::vector<int64_t> seeds;
  std::vector<bool> keyed;
  TF_RETURN_IF_ERROR(c->GetAttr("inits", &inits));
  TF_RETURN_IF_ERROR(c->GetAttr("seeds", &seeds));
  TF_RETURN_IF_ERROR(c->GetAttr("keyed", &keyed));
  if (static_cast<int>(inits.size()) != n || static_cast<int>(seeds.size()) != n ||
      static_cast<int>(keyed.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inits, seeds and keyed must hold one entry per table (", n, "), got ", inits.size(),
        ", ", seeds.size(), ", ", keyed.size()));
  }
  specs->clear();
  for (int i = 0; i < n; ++i) {
    InitSpec init;
    init.kind = InitKindOf(inits[i]);
    init.seed = static_cast<uint64_t>(seeds[i]);
    init.keyed = keyed[i];
    specs->push_back(init);
  }
  return absl::OkStatus();
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_GROUPED_H_

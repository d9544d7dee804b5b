// TfraDeFindInitGroup: the lookups of several tables of one device in one op
// (one call per parameter server and step, whatever the number of tables).
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_grouped.h"
#include "de_kernel.h"
#include "de_table.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfra_de {
namespace {

REGISTER_OP("TfraDeFindInitGroup")
    .Input("tables: N * resource")
    .Input("keys: key_dtype")
    .Input("counts: int64")
    .Input("init_args: N * double")
    .Output("values: value_dtype")
    .Attr("N: int >= 1")
    .Attr("key_dtype: {int32, int64, string}")
    .Attr("value_dtype: {half, bfloat16, float, double}")
    .Attr("inits: list(string)")
    .Attr("seeds: list(int)")
    .Attr("keyed: list(bool)")
    .SetIsStateful()
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    })
    .Doc("Rows of the keys of N tables, without inserting: table i's keys are counts[i] "
         "consecutive entries of keys (1-D, every table's in turn) and their rows the matching "
         "[counts[i], dim_i] block of values (flat). A missing key gets the initial row "
         "TfraDeFindInit draws (inits[i], init_args[i], seeds[i], keyed[i]). One tensor of each "
         "kind per call, so a parameter server receives one and sends one per step.");

class FindInitGroupOp : public OpKernel {
 public:
  explicit FindInitGroupOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("N", &n_));
    OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &key_dtype_));
    OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &value_dtype_));
    OP_REQUIRES_OK(c, ReadInitAttrs(c, n_, &inits_));
  }

  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const Tensor& keys = ctx->input(n_);
      const Tensor& counts = ctx->input(n_ + 1);
      OP_REQUIRES_OK(ctx, CheckKeys(keys));
      int64_t nkeys = 0, nvalues = 0;
      OP_REQUIRES_OK(ctx, ReadCounts(counts, n_, &nkeys));
      OP_REQUIRES(ctx, keys.NumElements() == nkeys,
                  absl::InvalidArgumentError(absl::StrCat(
                      "keys must hold sum(counts) = ", nkeys, " keys, got ", keys.NumElements())));
      std::vector<TableRef> tables(n_);
      std::vector<InitSpec> inits = inits_;
      for (int i = 0; i < n_; ++i) {
        OP_REQUIRES_OK(ctx, ResolveListedTable(ctx, i, key_dtype_, value_dtype_, &tables[i]));
        OP_REQUIRES_OK(ctx, ReadInitArgs(ctx->input(n_ + 2 + i), tables[i]->dim(), &inits[i]));
        OP_REQUIRES_OK(ctx, CheckInitSpec(inits[i]));
        nvalues += counts.flat<int64_t>()(i) * tables[i]->dim();
      }
      Tensor* values;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({nvalues}), &values));
      char* out = const_cast<char*>(values->tensor_data().data());
      const int64_t width = tensorflow::DataTypeSize(value_dtype_);
      int64_t key_at = 0;
      for (int i = 0; i < n_; ++i) {
        const int64_t c = counts.flat<int64_t>()(i);
        Tensor table_keys, exists;
        OP_REQUIRES_OK(ctx, CopyFlatSlice(ctx, keys, key_at, c, {c}, &table_keys));
        OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_BOOL, TensorShape({c}), &exists));
        OP_REQUIRES_OK(ctx, tables[i]->FindInit(ctx, table_keys, inits[i], /*insert=*/false, out,
                                                exists.flat<bool>().data()));
        out += c * tables[i]->dim() * width;
        key_at += c;
      }
    });
  }

 private:
  int n_ = 0;
  DataType key_dtype_ = tensorflow::DT_INVALID;
  DataType value_dtype_ = tensorflow::DT_INVALID;
  std::vector<InitSpec> inits_;
};

REGISTER_KERNEL_BUILDER(Name("TfraDeFindInitGroup").Device(tensorflow::DEVICE_CPU),
                        FindInitGroupOp);

}  // namespace
}  // namespace tfra_de

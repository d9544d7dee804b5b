// What every table kernel shares: failures turned into a Status, input checks,
// the handle-resolving base class, the table-creating kernel, reshaping and
// slice copies. Used by the native ops (de_ops.cc) and by TFRA's op names over
// the same tables (de_tfra_ops.cc, de_tfra_data_flow.cc).
#ifndef TFRA_DE_CC_OPS_DE_KERNEL_H_
#define TFRA_DE_CC_OPS_DE_KERNEL_H_

#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_table.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"

namespace tfra_de {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;

// Runs `body`, turning C++ exceptions into a failed status.
template <class Fn>
inline void Guarded(OpKernelContext* ctx, Fn&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    ctx->CtxFailure(__FILE__, __LINE__, absl::ResourceExhaustedError("out of memory in a native table op"));
  } catch (const std::exception& e) {
    ctx->CtxFailure(__FILE__, __LINE__, absl::InternalError(absl::StrCat("native table op: ", e.what())));
  }
}

inline Status CheckKeys(const Tensor& keys) {
  if (!TensorShapeUtils::IsVector(keys.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys must be a 1-D tensor, got shape ", keys.shape().DebugString()));
  }
  return absl::OkStatus();
}

inline Status CheckRows(const char* name, const Tensor& rows, int64_t n, int64_t dim) {
  if (rows.dims() != 2 || rows.dim_size(0) != n || rows.dim_size(1) != dim) {
    return absl::InvalidArgumentError(absl::StrCat("Expected shape [", n, ", ", dim, "] for ",
                                                   name, " (one row of dim ", dim,
                                                   " per key), got ", rows.shape().DebugString()));
  }
  return absl::OkStatus();
}

inline Status CheckScalar(const char* name, const Tensor& t) {
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " must be a scalar, got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}

// The initial rows of a fused op's missing keys (TfraDeFindInit, TfraDeApplyGradients):
// init_args[0] is [a, b] of a random kind, [1] or [dim] of a constant.
inline Status ReadInitArgs(const Tensor& args, int64_t dim, InitSpec* init) {
  const int64_t len = args.dims() == 1 ? args.dim_size(0) : -1;
  const double* v = args.dims() == 1 ? args.flat<double>().data() : nullptr;
  if (init->kind == InitSpec::kConstant) {
    if (len != 1 && len != dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init_args of a constant initializer must have shape [1] or [dim] = [", dim,
          "], got ", args.shape().DebugString()));
    }
    if (len == 1) {
      init->a = v[0];
    } else {
      init->row = v;
    }
    return absl::OkStatus();
  }
  if (len != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "init_args of a random initializer must have shape [2] (a, b), got ",
        args.shape().DebugString()));
  }
  init->a = v[0];
  init->b = v[1];
  return absl::OkStatus();
}

inline Status CheckInitSpec(const InitSpec& init) {
  if (init.kind == InitSpec::kConstant) return absl::OkStatus();
  if (!std::isfinite(init.a) || !std::isfinite(init.b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "initializer parameters must be finite, got a = ", init.a, ", b = ", init.b));
  }
  if (init.kind == InitSpec::kUniform && !(init.b > init.a)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a uniform initializer needs maxval > minval, got minval = ", init.a,
        ", maxval = ", init.b));
  }
  if (init.kind != InitSpec::kUniform && init.b < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a normal initializer needs stddev >= 0, got stddev = ", init.b));
  }
  return absl::OkStatus();
}

// fills: a 1-D double tensor of slot group start values.
inline Status ReadFills(const Tensor& t, std::vector<double>* fills) {
  if (t.dims() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("fills must be a 1-D tensor, got shape ",
                                                   t.shape().DebugString()));
  }
  const auto v = t.flat<double>();
  fills->assign(v.data(), v.data() + v.size());
  return absl::OkStatus();
}

// Base of every kernel taking a table: resolves the handle and checks that
// the table matches the dtypes/dim the op was built for.
class TableOp : public OpKernel {
 public:
  explicit TableOp(OpKernelConstruction* c) : OpKernel(c) {
    if (c->HasAttr("key_dtype")) OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &key_dtype_));
    if (c->HasAttr("value_dtype")) OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &value_dtype_));
    if (c->HasAttr("dim")) OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }

  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const Tensor& h = ctx->input(0);
      OP_REQUIRES(ctx, h.dtype() == tensorflow::DT_RESOURCE && h.NumElements() == 1,
                  absl::InvalidArgumentError(absl::StrCat("table must be a scalar resource handle, got ",
                                                          h.shape().DebugString())));
      tensorflow::core::RefCountPtr<TableBase> table;
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, h.flat<tensorflow::ResourceHandle>()(0), &table));
      const TableConfig& cfg = table->config();
      OP_REQUIRES(ctx,
                  (key_dtype_ == tensorflow::DT_INVALID || key_dtype_ == cfg.key_dtype) &&
                      (value_dtype_ == tensorflow::DT_INVALID || value_dtype_ == cfg.value_dtype) &&
                      (dim_ < 0 || dim_ == cfg.dim),
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": op built for ", tensorflow::DataTypeString(key_dtype_), " -> ",
                      tensorflow::DataTypeString(value_dtype_), "[", dim_, "] but the table is ",
                      tensorflow::DataTypeString(cfg.key_dtype), " -> ",
                      tensorflow::DataTypeString(cfg.value_dtype), "[", cfg.dim, "]")));
      Run(ctx, table.get());
    });
  }

 protected:
  virtual void Run(OpKernelContext* ctx, TableBase* table) = 0;

  Status AllocRows(OpKernelContext* ctx, int idx, int64_t n, int64_t dim, Tensor** out) {
    TensorShape shape;
    TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape({n, dim}, &shape));
    return ctx->allocate_output(idx, shape, out);
  }

  DataType key_dtype_ = tensorflow::DT_INVALID;
  DataType value_dtype_ = tensorflow::DT_INVALID;
  int64_t dim_ = -1;
};

class TableHandleOp : public OpKernel {
 public:
  explicit TableHandleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("container", &container_));
    OP_REQUIRES_OK(c, c->GetAttr("shared_name", &name_));
    bool node_name_sharing = false;
    OP_REQUIRES_OK(c, c->GetAttr("use_node_name_sharing", &node_name_sharing));
    if (name_.empty()) {
      // Node-name sharing: every run of a graph (and every worker building the
      // same graph) sees one table. Otherwise the table belongs to this kernel
      // instance (e.g. the creator function of a loaded SavedModel).
      static std::atomic<int64_t> counter{0};
      private_ = !node_name_sharing;
      name_ = private_ ? absl::StrCat("_tfra_de_private_", counter.fetch_add(1), "_", def().name())
                       : absl::StrCat("tfra_de_", def().name());
    }
    OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &cfg_.key_dtype));
    OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &cfg_.value_dtype));
    if (c->HasAttr("dim")) {
      OP_REQUIRES_OK(c, c->GetAttr("dim", &cfg_.dim));
    } else {  // TFRA's table op: rows of value_shape [dim]
      tensorflow::TensorShape shape;
      OP_REQUIRES_OK(c, c->GetAttr("value_shape", &shape));
      OP_REQUIRES(c, shape.dims() == 1,
                  absl::InvalidArgumentError(absl::StrCat(
                      "value_shape must be [dim] (a row per key), got ", shape.DebugString())));
      cfg_.dim = shape.dim_size(0);
    }
    if (c->HasAttr("init_size")) OP_REQUIRES_OK(c, c->GetAttr("init_size", &cfg_.init_size));
    int64_t shards = 0;
    if (c->HasAttr("num_shards")) OP_REQUIRES_OK(c, c->GetAttr("num_shards", &shards));
    OP_REQUIRES(c, shards >= 0 && shards <= kMaxShards,
                absl::InvalidArgumentError(absl::StrCat("num_shards must be in [0, ", kMaxShards, "], got ", shards)));
    cfg_.num_shards = static_cast<int>(shards);
    OP_REQUIRES(c, cfg_.dim >= 1 && cfg_.dim <= kMaxDim,
                absl::InvalidArgumentError(absl::StrCat("dim must be in [1, ", kMaxDim, "], got ", cfg_.dim)));
  }

  ~TableHandleOp() override {
    if (private_ && rm_ != nullptr) rm_->Delete<TableBase>(resolved_container_, name_).IgnoreError();
  }

  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      tensorflow::ResourceMgr* rm = ctx->resource_manager();
      const std::string container = container_.empty() ? rm->default_container() : container_;
      if (private_) {
        std::lock_guard<std::mutex> l(mu_);
        rm_ = rm;
        resolved_container_ = container;
      }
      TableBase* table = nullptr;
      OP_REQUIRES_OK(ctx, rm->LookupOrCreate<TableBase>(
                              container, name_, &table,
                              [this](TableBase** out) { return CreateTable(cfg_, out); }));
      tensorflow::core::ScopedUnref unref(table);
      const TableConfig& have = table->config();
      OP_REQUIRES(ctx,
                  have.key_dtype == cfg_.key_dtype && have.value_dtype == cfg_.value_dtype &&
                      have.dim == cfg_.dim,
                  absl::InvalidArgumentError(absl::StrCat(
                      "shared_name '", name_, "' already names a table of ",
                      tensorflow::DataTypeString(have.key_dtype), " -> ",
                      tensorflow::DataTypeString(have.value_dtype), "[", have.dim, "], not ",
                      tensorflow::DataTypeString(cfg_.key_dtype), " -> ",
                      tensorflow::DataTypeString(cfg_.value_dtype), "[", cfg_.dim, "]")));
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
      out->scalar<tensorflow::ResourceHandle>()() =
          tensorflow::MakeResourceHandle<TableBase>(ctx, container, name_);
    });
  }

 private:
  std::string container_, name_;
  TableConfig cfg_;
  bool private_ = false;
  std::mutex mu_;
  tensorflow::ResourceMgr* rm_ = nullptr;
  std::string resolved_container_;
};

inline Status SetScalarOutput(OpKernelContext* ctx, int index, int64_t value) {
  Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, TensorShape({}), &out));
  out->scalar<int64_t>()() = value;
  return absl::OkStatus();
}

// `t` seen with shape `shape` (same elements, shared buffer).
inline Status Reshaped(const Tensor& t, const TensorShape& shape, const char* what, Tensor* out) {
  if (!out->CopyFrom(t, shape)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must have ", shape.num_elements(),
                                                   " elements (shape ", shape.DebugString(),
                                                   "), got shape ", t.shape().DebugString()));
  }
  return absl::OkStatus();
}


// Element i of `src` (its first dimension's slices) into slice j of `dst`, for
// every element type a table or a partition may hold.
class SliceCopier {
 public:
  SliceCopier(const Tensor& src, Tensor* dst) : src_(src), dst_(dst) {
    const int64_t n = src.dims() == 0 ? 1 : src.dim_size(0);
    per_ = n == 0 ? 0 : src.NumElements() / n;
    bytes_ = tensorflow::DataTypeSize(src.dtype());
  }
  static Status Check(DataType dtype) {
    if (dtype == tensorflow::DT_STRING || tensorflow::DataTypeSize(dtype) > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported element type ", tensorflow::DataTypeString(dtype)));
  }
  void Copy(int64_t i, int64_t j) const {
    if (src_.dtype() == tensorflow::DT_STRING) {
      const auto* from = src_.flat<tensorflow::tstring>().data() + i * per_;
      auto* to = dst_->flat<tensorflow::tstring>().data() + j * per_;
      for (int64_t k = 0; k < per_; ++k) to[k] = from[k];
      return;
    }
    const size_t row = static_cast<size_t>(per_ * bytes_);
    std::memcpy(const_cast<char*>(dst_->tensor_data().data()) + j * row, src_.tensor_data().data() + i * row, row);
  }

 private:
  const Tensor& src_;
  Tensor* dst_;
  int64_t per_ = 0;
  int bytes_ = 0;
};


}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_KERNEL_H_

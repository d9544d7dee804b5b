// TFRA's data-flow op names (TFRA>DynamicPartition, TFRA>DynamicStitch,
// ...StitchFast, ...ParallelDynamicStitch), which TFRA's graphs use to split keys
// over shard tables and join their rows: tf.dynamic_partition / dynamic_stitch
// semantics for every element type (later inputs win on a repeated index).
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_kernel.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace tfra_de {
namespace {

using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

// dynamic_stitch: [max index + 1 (unknown unless constant)] + data's row shape.
Status StitchShape(InferenceContext* c) {
  int32_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  ShapeHandle rest = c->UnknownShape();
  for (int i = 0; i < n; ++i) {
    const ShapeHandle indices = c->input(i);
    if (!c->RankKnown(indices)) continue;
    ShapeHandle prefix, tail;
    TF_RETURN_IF_ERROR(c->MergePrefix(c->input(n + i), indices, &prefix, &tail));
    TF_RETURN_IF_ERROR(c->Subshape(c->input(n + i), c->Rank(indices), &tail));
    TF_RETURN_IF_ERROR(c->Merge(rest, tail, &rest));
  }
  ShapeHandle out;
  TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), rest, &out));
  c->set_output(0, out);
  return absl::OkStatus();
}


REGISTER_OP("TFRA>DynamicPartition")
    .Input("data: T")
    .Input("partitions: int32")
    .Output("outputs: num_partitions * T")
    .Attr("num_partitions: int >= 1")
    .Attr("T: type")
    .SetShapeFn([](InferenceContext* c) {
      if (!c->RankKnown(c->input(1))) return tensorflow::shape_inference::UnknownShape(c);
      ShapeHandle prefix, rest, out;
      TF_RETURN_IF_ERROR(c->MergePrefix(c->input(0), c->input(1), &prefix, &rest));
      TF_RETURN_IF_ERROR(c->Subshape(c->input(0), c->Rank(c->input(1)), &rest));
      TF_RETURN_IF_ERROR(c->Concatenate(c->Vector(InferenceContext::kUnknownDim), rest, &out));
      for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, out);
      return absl::OkStatus();
    })
    .Doc("tf.dynamic_partition under TFRA's name.");

#define TFRA_DE_STITCH_OP(name)     \
  REGISTER_OP(name)                 \
      .Input("indices: N * int32")  \
      .Input("data: N * T")         \
      .Output("merged: T")          \
      .Attr("N : int >= 1")         \
      .Attr("T : type")             \
      .SetShapeFn(StitchShape)      \
      .Doc("tf.dynamic_stitch under TFRA's name.")

TFRA_DE_STITCH_OP("TFRA>DynamicStitch");
TFRA_DE_STITCH_OP("TFRA>DynamicStitchFast");
TFRA_DE_STITCH_OP("TFRA>ParallelDynamicStitch");

class TfraDynamicPartitionOp : public OpKernel {
 public:
  explicit TfraDynamicPartitionOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("num_partitions", &num_partitions_));
  }
  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const Tensor& data = ctx->input(0);
      const Tensor& partitions = ctx->input(1);
      OP_REQUIRES_OK(ctx, SliceCopier::Check(data.dtype()));
      OP_REQUIRES(ctx, TensorShapeUtils::StartsWith(data.shape(), partitions.shape()),
                  absl::InvalidArgumentError(absl::StrCat(
                      "data.shape must start with partitions.shape, got data.shape = ",
                      data.shape().DebugString(), ", partitions.shape = ",
                      partitions.shape().DebugString())));
      const int64_t n = partitions.NumElements();
      TensorShape rest;
      for (int d = partitions.dims(); d < data.dims(); ++d) rest.AddDim(data.dim_size(d));
      TensorShape flat_shape({n});
      flat_shape.AppendShape(rest);
      Tensor flat;
      OP_REQUIRES_OK(ctx, Reshaped(data, flat_shape, "data", &flat));
      const int32_t* p = partitions.flat<int32_t>().data();
      std::vector<int64_t> counts(num_partitions_, 0);
      for (int64_t i = 0; i < n; ++i) {
        OP_REQUIRES(ctx, p[i] >= 0 && p[i] < num_partitions_,
                    absl::InvalidArgumentError(absl::StrCat("partitions[", i, "] = ", p[i],
                                                            " is not in [0, ", num_partitions_, ")")));
        ++counts[p[i]];
      }
      std::vector<Tensor*> outs(num_partitions_);
      std::vector<SliceCopier> copiers;
      copiers.reserve(num_partitions_);
      for (int j = 0; j < num_partitions_; ++j) {
        TensorShape shape({counts[j]});
        shape.AppendShape(rest);
        OP_REQUIRES_OK(ctx, ctx->allocate_output(j, shape, &outs[j]));
        copiers.emplace_back(flat, outs[j]);
      }
      std::vector<int64_t> next(num_partitions_, 0);
      for (int64_t i = 0; i < n; ++i) copiers[p[i]].Copy(i, next[p[i]]++);
    });
  }

 private:
  int num_partitions_ = 0;
};

class TfraDynamicStitchOp : public OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const int n = num_inputs() / 2;
      const Tensor& data0 = ctx->input(n);
      OP_REQUIRES_OK(ctx, SliceCopier::Check(data0.dtype()));
      const TensorShape& idx0 = ctx->input(0).shape();
      OP_REQUIRES(ctx, TensorShapeUtils::StartsWith(data0.shape(), idx0),
                  absl::InvalidArgumentError(absl::StrCat(
                      "data[0].shape must start with indices[0].shape, got ",
                      data0.shape().DebugString(), " and ", idx0.DebugString())));
      TensorShape rest;
      for (int d = idx0.dims(); d < data0.dims(); ++d) rest.AddDim(data0.dim_size(d));
      int64_t rows = 0;
      std::vector<Tensor> flats(n);
      for (int i = 0; i < n; ++i) {
        const Tensor& indices = ctx->input(i);
        const Tensor& data = ctx->input(n + i);
        TensorShape want = indices.shape();
        want.AppendShape(rest);
        OP_REQUIRES(ctx, data.shape() == want,
                    absl::InvalidArgumentError(absl::StrCat(
                        "data[", i, "].shape must be indices[", i, "].shape + ", rest.DebugString(),
                        " = ", want.DebugString(), ", got ", data.shape().DebugString())));
        TensorShape flat_shape({indices.NumElements()});
        flat_shape.AppendShape(rest);
        OP_REQUIRES_OK(ctx, Reshaped(data, flat_shape, "data", &flats[i]));
        const int32_t* at = indices.flat<int32_t>().data();
        for (int64_t j = 0; j < indices.NumElements(); ++j) {
          OP_REQUIRES(ctx, at[j] >= 0,
                      absl::InvalidArgumentError(absl::StrCat("indices[", i, "][", j, "] = ", at[j],
                                                              " is negative")));
          rows = std::max<int64_t>(rows, int64_t{at[j]} + 1);
        }
      }
      TensorShape out_shape({rows});
      out_shape.AppendShape(rest);
      Tensor* merged;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, out_shape, &merged));
      for (int i = 0; i < n; ++i) {  // later inputs win, as tf.dynamic_stitch
        const SliceCopier copy(flats[i], merged);
        const int32_t* at = ctx->input(i).flat<int32_t>().data();
        for (int64_t j = 0; j < ctx->input(i).NumElements(); ++j) copy.Copy(j, at[j]);
      }
    });
  }
};

#define TFRA_DE_DATA_FLOW_KERNEL(name, cls) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), cls)

TFRA_DE_DATA_FLOW_KERNEL("TFRA>DynamicPartition", TfraDynamicPartitionOp);
TFRA_DE_DATA_FLOW_KERNEL("TFRA>DynamicStitch", TfraDynamicStitchOp);
TFRA_DE_DATA_FLOW_KERNEL("TFRA>DynamicStitchFast", TfraDynamicStitchOp);
TFRA_DE_DATA_FLOW_KERNEL("TFRA>ParallelDynamicStitch", TfraDynamicStitchOp);

}  // namespace
}  // namespace tfra_de

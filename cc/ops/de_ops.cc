// Op registrations and CPU kernels of the native dynamic-embedding table.
// Kernels validate every input and turn all failures (including allocation
// failures) into a Status: no input can crash the process.
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_kernel.h"
#include "de_table.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace tfra_de {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

#define TFRA_DE_TYPE_ATTRS                               \
  Attr("key_dtype: {int32, int64, string}")              \
      .Attr("value_dtype: {half, bfloat16, float, double}")

// ------------------------------------------------------------ shape fns --

// Output `idx` is [N, dim] with N from the keys (input 1) and dim from attr.
Status RowsShape(InferenceContext* c, int idx) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(idx, c->Matrix(c->Dim(keys, 0), dim));
  return absl::OkStatus();
}

Status FindShape(InferenceContext* c) {
  TF_RETURN_IF_ERROR(RowsShape(c, 0));
  c->set_output(1, c->Vector(c->Dim(c->input(1), 0)));
  return absl::OkStatus();
}

Status UpdateShape(InferenceContext* c) {
  ShapeHandle keys, values;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &values));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(values, 0), &unused));
  return absl::OkStatus();
}

// --------------------------------------------------------- registrations --

REGISTER_OP("TfraDeTable")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("init_size: int >= 0 = 0")
    .Attr("num_shards: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Creates (or finds, by container/shared_name) a native hash table of key -> [dim] rows. "
         "Without a shared_name the table is named by the node (use_node_name_sharing) or is "
         "private to this kernel and deleted with it.");

REGISTER_OP("TfraDeFind")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Input("default_values: value_dtype")
    .Output("values: value_dtype")
    .Output("exists: bool")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetShapeFn(FindShape)
    .Doc("Rows of keys; a missing key gets default_values ([dim] or its row of [N, dim]).");

REGISTER_OP("TfraDeContains")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Output("exists: bool")
    .Attr("key_dtype: {int32, int64, string}")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      c->set_output(0, c->Vector(c->Dim(keys, 0)));
      return absl::OkStatus();
    })
    .Doc("Whether each key is present (the index alone is probed; no row is read).");

REGISTER_OP("TfraDeFindInit")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("init_args: num_init_args * double")
    .Output("values: value_dtype")
    .Output("exists: bool")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("insert: bool = false")
    .Attr("init: {'constant', 'uniform', 'normal', 'truncated_normal'} = 'constant'")
    .Attr("a: float = 0.0")
    .Attr("b: float = 0.0")
    .Attr("seed: int = 0")
    .Attr("keyed: bool = false")
    .Attr("num_init_args: int >= 0 = 0")
    .SetIsStateful()
    .SetShapeFn(FindShape)
    .Doc("Rows of keys; a missing key gets an initial row that is a function of (seed, key), "
         "inserted when `insert`. init: constant(a) | uniform[a, b) | normal(a, b) | "
         "truncated_normal(a, b) (within 2 stddev). init_args: none (a, b from the float "
         "attrs) or one double tensor: [a, b] in full precision, or for constant a [1] or "
         "[dim] row. keyed: rows by the recipe of tables/keyed_random.py (equal to its TF "
         "ops' rows) instead of the faster ziggurat normals.");

REGISTER_OP("TfraDeInsertMissing")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .Output("stored: value_dtype")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(UpdateShape(c));
      return RowsShape(c, 0);
    })
    .Doc("Inserts keys[i] -> values[i] where absent; returns the rows now stored.");

REGISTER_OP("TfraDeInsert")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .TFRA_DE_TYPE_ATTRS
    .SetShapeFn(UpdateShape)
    .Doc("Upserts rows; with duplicate keys the last row wins.");

REGISTER_OP("TfraDeAccum")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Input("deltas: value_dtype")
    .TFRA_DE_TYPE_ATTRS
    .SetShapeFn(UpdateShape)
    .Doc("Adds deltas to rows; a missing key is inserted with its delta.");

REGISTER_OP("TfraDeRemove")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Output("removed: int64")
    .Attr("key_dtype: {int32, int64, string}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Removes keys (missing keys are ignored); returns how many were removed.");

REGISTER_OP("TfraDeClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_OP("TfraDeSize")
    .Input("table: resource")
    .SetIsStateful()
    .Output("size: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfraDeMemory")
    .Input("table: resource")
    .SetIsStateful()
    .Output("bytes: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Bytes the table holds (records, index, free lists, long string keys); 0 for a "
         "column-group view, whose columns are counted in its table.");

REGISTER_OP("TfraDeMemoryParts")
    .Input("table: resource")
    .SetIsStateful()
    .Output("parts: int64")
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(4));
      return absl::OkStatus();
    })
    .Doc("TfraDeMemory's bytes by part: [record bytes, rows those records hold (live, freed "
         "for reuse, prefaulted), index bytes, other bytes (free lists, long string keys)].");

REGISTER_OP("TfraDeExport")
    .Input("table: resource")
    .SetIsStateful()
    .Input("cursor: int64")
    .Input("limit: int64")
    .Output("keys: key_dtype")
    .Output("values: value_dtype")
    .Output("stamps: int64")
    .Output("freqs: int64")
    .Output("next_cursor: int64")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("with_values: bool = true")
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      bool with_values;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      TF_RETURN_IF_ERROR(c->GetAttr("with_values", &with_values));
      DimensionHandle n = c->UnknownDim();
      c->set_output(0, c->Vector(n));
      c->set_output(1, c->Matrix(n, with_values ? dim : 0));
      c->set_output(2, c->Vector(n));
      c->set_output(3, c->Vector(n));
      c->set_output(4, c->Scalar());
      return absl::OkStatus();
    })
    .Doc("Rows from `cursor` (0 = start), at most `limit` (< 0: all rows as one consistent "
         "snapshot), with their metadata; next_cursor is -1 when the table is exhausted. "
         "with_values=false: values is [n, 0] (keys and metadata only, no row copied).");

REGISTER_OP("TfraDeImport")
    .Input("table: resource")
    .SetIsStateful()
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .Input("stamps: int64")
    .Input("freqs: int64")
    .Input("clear_first: bool")
    .TFRA_DE_TYPE_ATTRS
    .SetShapeFn(UpdateShape)
    .Doc("Writes rows (and metadata, when stamps/freqs are non-empty); with clear_first the "
         "table content is replaced atomically.");

REGISTER_OP("TfraDeSetStep")
    .Input("table: resource")
    .SetIsStateful()
    .Input("step: int64")
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Sets the stamp written with rows from now on (< 0: wall-clock seconds).");

REGISTER_OP("TfraDeSetBound")
    .Input("table: resource")
    .SetIsStateful()
    .Input("max_rows: int64")
    .Input("extra_rows: int64")
    .Input("lfu: bool")
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Bounds the keys training writes may leave in the table (max_rows 0: no bound); a "
         "new key over it first evicts its shard's lowest-scoring rows not written at the "
         "current stamp (extra_rows more over all shards).");

REGISTER_OP("TfraDeEvict")
    .Input("table: resource")
    .SetIsStateful()
    .Input("min_stamp: int64")
    .Input("min_freq: int64")
    .Output("removed: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Removes rows with stamp < min_stamp or freq < min_freq; returns how many.");

REGISTER_OP("TfraDeSaveToFile")
    .Input("table: resource")
    .SetIsStateful()
    .Input("path: string")
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Streams the table (rows and metadata) to a checksummed file, shard by shard.");

REGISTER_OP("TfraDeLoadFromFile")
    .Input("table: resource")
    .SetIsStateful()
    .Input("path: string")
    .Output("loaded: int64")
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Replaces the table content with a file written by TfraDeSaveToFile; on any error "
         "the table is left unchanged.");

REGISTER_OP("TfraDeGroupView")
    .Input("table: resource")
    .Input("fills: double")
    .Output("view: resource")
    .Attr("group: int >= 1")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Column group `group` of a table as a table of its own (an optimizer slot kept in "
         "its variable's records): every table op works on it; its keys are the table's keys "
         "the group was written for (its size, exports, files, lookups), removals are the "
         "table's. Adds the groups 1..group to the table first where missing, group g "
         "starting at fills[g - 1] (fills: [group]).");

REGISTER_OP("TfraDeFindGroups")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("fills: double")
    .Output("values: N * value_dtype")
    .Output("exists: bool")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("groups: list(int) >= 1")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      int64_t dim, n;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t j = 0; j < n; ++j) c->set_output(j, c->Matrix(c->Dim(keys, 0), dim));
      c->set_output(n, c->Vector(c->Dim(keys, 0)));
      return absl::OkStatus();
    })
    .Doc("The rows of the listed column groups of keys (values[j]: group groups[j]; N = "
         "len(groups)), one probe per key; a missing key gets zeros for group 0 and the fill "
         "of each slot group. fills: [slot groups] as for TfraDeGroupView (added where "
         "missing).");

REGISTER_OP("TfraDeUpsertGroups")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: N * value_dtype")
    .Input("fills: double")
    .TFRA_DE_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("groups: list(int) >= 1")
    .Attr("N: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle keys, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
      int64_t n;
      TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
      for (int64_t j = 0; j < n; ++j) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(2 + j), 2, &rows));
        DimensionHandle unused;
        TF_RETURN_IF_ERROR(c->Merge(c->Dim(keys, 0), c->Dim(rows, 0), &unused));
      }
      return absl::OkStatus();
    })
    .Doc("Writes the listed column groups of keys (values[j]: [N, dim] rows of groups[j]), "
         "one probe per key; a new key's other groups start at zeros / their fills. Writing "
         "group 0 stamps the row and counts a write.");

// --------------------------------------------------------------- kernels --

class FindOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& dflt = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.dim_size(0), dim = t->dim();
    const bool ok = (dflt.dims() == 1 && dflt.dim_size(0) == dim) ||
                    (dflt.dims() == 2 && dflt.dim_size(0) == n && dflt.dim_size(1) == dim);
    OP_REQUIRES(ctx, ok,
                absl::InvalidArgumentError(absl::StrCat(
                    "default_values must have shape [", dim, "] or [", n, ", ", dim, "], got ",
                    dflt.shape().DebugString())));
    Tensor *values, *exists;
    OP_REQUIRES_OK(ctx, AllocRows(ctx, 0, n, dim, &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &exists));
    OP_REQUIRES_OK(ctx, t->Find(ctx, keys, dflt, values, exists, 0));
  }
};

class ContainsOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    Tensor* exists;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({keys.dim_size(0)}), &exists));
    OP_REQUIRES_OK(ctx, t->Contains(ctx, keys, exists, 0));
  }
};

class FindInitOp : public TableOp {
 public:
  explicit FindInitOp(OpKernelConstruction* c) : TableOp(c) {
    std::string kind;
    float a, b;
    int64_t seed;
    OP_REQUIRES_OK(c, c->GetAttr("insert", &insert_));
    OP_REQUIRES_OK(c, c->GetAttr("init", &kind));
    OP_REQUIRES_OK(c, c->GetAttr("a", &a));
    OP_REQUIRES_OK(c, c->GetAttr("b", &b));
    OP_REQUIRES_OK(c, c->GetAttr("seed", &seed));
    init_.kind = kind == "uniform" ? InitSpec::kUniform
                 : kind == "normal" ? InitSpec::kNormal
                 : kind == "truncated_normal" ? InitSpec::kTruncatedNormal
                                              : InitSpec::kConstant;
    init_.a = a;
    init_.b = b;
    init_.seed = static_cast<uint64_t>(seed);
    OP_REQUIRES_OK(c, c->GetAttr("keyed", &init_.keyed));
    OP_REQUIRES_OK(c, c->GetAttr("num_init_args", &num_args_));
    OP_REQUIRES(c, num_args_ <= 1,
                absl::InvalidArgumentError(absl::StrCat(
                    "init_args must hold at most one tensor, got ", num_args_)));
  }
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    InitSpec init = init_;
    if (num_args_ == 1) OP_REQUIRES_OK(ctx, ReadInitArgs(ctx->input(2), t->dim(), &init));
    OP_REQUIRES_OK(ctx, CheckInitSpec(init));
    const int64_t n = keys.dim_size(0);
    Tensor *values, *exists;
    OP_REQUIRES_OK(ctx, AllocRows(ctx, 0, n, t->dim(), &values));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &exists));
    OP_REQUIRES_OK(ctx, t->FindInit(ctx, keys, init, insert_,
                                    const_cast<char*>(values->tensor_data().data()),
                                    exists->flat<bool>().data()));
  }

 private:
  bool insert_ = false;
  int64_t num_args_ = 0;
  InitSpec init_;
};

class InsertMissingOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES_OK(ctx, CheckRows("values", values, n, t->dim()));
    Tensor* stored;
    OP_REQUIRES_OK(ctx, AllocRows(ctx, 0, n, t->dim(), &stored));
    OP_REQUIRES_OK(ctx, t->InsertMissing(ctx, keys, values, stored));
  }
};

class UpsertOp : public TableOp {
 public:
  UpsertOp(OpKernelConstruction* c, bool accum) : TableOp(c), accum_(accum) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    OP_REQUIRES_OK(ctx, CheckRows(accum_ ? "deltas" : "values", values, keys.dim_size(0), t->dim()));
    OP_REQUIRES_OK(ctx, accum_ ? t->Accum(ctx, keys, values, 0) : t->Insert(ctx, keys, values, 0));
  }

 private:
  bool accum_;
};
class InsertOp : public UpsertOp {
 public:
  explicit InsertOp(OpKernelConstruction* c) : UpsertOp(c, false) {}
};
// Writes an int64 scalar output (counts, cursors).

class AccumOp : public UpsertOp {
 public:
  explicit AccumOp(OpKernelConstruction* c) : UpsertOp(c, true) {}
};

class RemoveOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    int64_t removed = 0;
    OP_REQUIRES_OK(ctx, t->Remove(ctx, keys, &removed));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, removed));
  }
};

class ClearOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext*, TableBase* t) override { t->Clear(0); }
};

class SizeOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, t->Size()));
  }
};

class MemoryOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, t->MemoryBytes()));
  }
};

class MemoryPartsOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const TableBase::MemoryUse use = t->Memory();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({4}), &out));
    auto parts = out->vec<int64_t>();
    parts(0) = use.records;
    parts(1) = use.rows;
    parts(2) = use.index;
    parts(3) = use.other;
  }
};

class ExportOp : public TableOp {
 public:
  explicit ExportOp(OpKernelConstruction* c) : TableOp(c) {
    OP_REQUIRES_OK(c, c->GetAttr("with_values", &with_values_));
  }

  class Sink : public ExportSink {
   public:
    Sink(OpKernelContext* ctx, int64_t dim, bool with_values)
        : ctx_(ctx), dim_(dim), with_values_(with_values) {}
    bool WantsValues() const override { return with_values_; }
    Status Allocate(int64_t n, Tensor** keys, Tensor** values, Tensor** stamps, Tensor** freqs) override {
      TF_RETURN_IF_ERROR(ctx_->allocate_output(0, TensorShape({n}), keys));
      TensorShape rows;
      TF_RETURN_IF_ERROR(TensorShape::BuildTensorShape({n, with_values_ ? dim_ : 0}, &rows));
      TF_RETURN_IF_ERROR(ctx_->allocate_output(1, rows, values));
      TF_RETURN_IF_ERROR(ctx_->allocate_output(2, TensorShape({n}), stamps));
      return ctx_->allocate_output(3, TensorShape({n}), freqs);
    }

   private:
    OpKernelContext* ctx_;
    int64_t dim_;
    bool with_values_;
  };

  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, CheckScalar("cursor", ctx->input(1)));
    OP_REQUIRES_OK(ctx, CheckScalar("limit", ctx->input(2)));
    const int64_t cursor = ctx->input(1).scalar<int64_t>()();
    const int64_t limit = ctx->input(2).scalar<int64_t>()();
    Sink sink(ctx, t->dim(), with_values_);
    int64_t next = -1;
    OP_REQUIRES_OK(ctx, t->Export(cursor, limit, &sink, &next, 0));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 4, next));
  }

 private:
  bool with_values_ = true;
};

class ImportOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    const Tensor& stamps = ctx->input(3);
    const Tensor& freqs = ctx->input(4);
    OP_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.dim_size(0);
    OP_REQUIRES_OK(ctx, CheckRows("values", values, n, t->dim()));
    for (const auto& m : {std::make_pair("stamps", &stamps), std::make_pair("freqs", &freqs)}) {
      OP_REQUIRES(ctx,
                  m.second->dims() == 1 && (m.second->dim_size(0) == n || m.second->dim_size(0) == 0),
                  absl::InvalidArgumentError(absl::StrCat(m.first, " must have shape [", n,
                                                          "] or [0], got ",
                                                          m.second->shape().DebugString())));
    }
    OP_REQUIRES_OK(ctx, CheckScalar("clear_first", ctx->input(5)));
    OP_REQUIRES_OK(ctx, t->Import(ctx, keys, values, stamps, freqs, ctx->input(5).scalar<bool>()(), 0));
  }
};

class SetStepOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, CheckScalar("step", ctx->input(1)));
    t->SetStep(ctx->input(1).scalar<int64_t>()());
  }
};

class SetBoundOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, CheckScalar("max_rows", ctx->input(1)));
    OP_REQUIRES_OK(ctx, CheckScalar("extra_rows", ctx->input(2)));
    OP_REQUIRES_OK(ctx, CheckScalar("lfu", ctx->input(3)));
    const int64_t max_rows = ctx->input(1).scalar<int64_t>()();
    const int64_t extra_rows = ctx->input(2).scalar<int64_t>()();
    OP_REQUIRES(ctx, max_rows >= 0 && extra_rows >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "set_bound: max_rows and extra_rows must be >= 0, got ", max_rows, " and ",
                    extra_rows)));
    t->SetBound(max_rows, extra_rows, ctx->input(3).scalar<bool>()());
  }
};

class EvictOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, CheckScalar("min_stamp", ctx->input(1)));
    OP_REQUIRES_OK(ctx, CheckScalar("min_freq", ctx->input(2)));
    int64_t removed = 0;
    OP_REQUIRES_OK(ctx, t->Evict(ctx->input(1).scalar<int64_t>()(), ctx->input(2).scalar<int64_t>()(), &removed));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, removed));
  }
};

Status GetPath(OpKernelContext* ctx, std::string* path) {
  TF_RETURN_IF_ERROR(CheckScalar("path", ctx->input(1)));
  *path = std::string(ctx->input(1).scalar<tensorflow::tstring>()());
  if (path->empty()) return absl::InvalidArgumentError("path must not be empty");
  return absl::OkStatus();
}

class SaveToFileOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    std::string path;
    OP_REQUIRES_OK(ctx, GetPath(ctx, &path));
    OP_REQUIRES_OK(ctx, t->SaveToFile(path, 0));
  }
};

class LoadFromFileOp : public TableOp {
 public:
  using TableOp::TableOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    std::string path;
    OP_REQUIRES_OK(ctx, GetPath(ctx, &path));
    int64_t loaded = 0;
    OP_REQUIRES_OK(ctx, t->LoadFromFile(path, 0, &loaded));
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, loaded));
  }
};

class GroupViewOp : public OpKernel {
 public:
  explicit GroupViewOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("group", &group_));
    OP_REQUIRES(c, group_ >= 1 && group_ < kMaxGroups,
                absl::InvalidArgumentError(absl::StrCat("group must be in [1, ", kMaxGroups, "), got ",
                                                        group_)));
  }
  void Compute(OpKernelContext* ctx) override {
    Guarded(ctx, [&] {
      const Tensor& h = ctx->input(0);
      OP_REQUIRES(ctx, h.dtype() == tensorflow::DT_RESOURCE && h.NumElements() == 1,
                  absl::InvalidArgumentError("table must be a scalar resource handle"));
      const tensorflow::ResourceHandle& handle = h.flat<tensorflow::ResourceHandle>()(0);
      tensorflow::core::RefCountPtr<TableBase> table;
      OP_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, handle, &table));
      OP_REQUIRES(ctx, dynamic_cast<GroupView*>(table.get()) == nullptr,
                  absl::InvalidArgumentError("table must be a table, not a column group view"));
      std::vector<double> fills;
      OP_REQUIRES_OK(ctx, ReadFills(ctx->input(1), &fills));
      OP_REQUIRES(ctx, static_cast<int64_t>(fills.size()) == group_,
                  absl::InvalidArgumentError(absl::StrCat("fills must hold the start values of groups 1..",
                                                          group_, ", got ", fills.size())));
      OP_REQUIRES_OK(ctx, table->EnsureGroups(fills));
      const std::string name = absl::StrCat(handle.name(), "/_group", group_);
      tensorflow::ResourceMgr* rm = ctx->resource_manager();
      auto find_or_make = [&](TableBase** view) {
        return rm->LookupOrCreate<TableBase>(handle.container(), name, view, [&](TableBase** out) {
          *out = new GroupView(table.get(), group_);
          return absl::OkStatus();
        });
      };
      TableBase* view = nullptr;
      OP_REQUIRES_OK(ctx, find_or_make(&view));
      auto* group_view = dynamic_cast<GroupView*>(view);
      if (group_view == nullptr || group_view->table() != table.get()) {
        // A view left by an earlier table of the same name (destroyed and made again in a
        // long-lived server): replace it, so the slot never reads a dead table.
        view->Unref();
        rm->Delete<TableBase>(handle.container(), name).IgnoreError();
        OP_REQUIRES_OK(ctx, find_or_make(&view));
      }
      tensorflow::core::ScopedUnref unref(view);
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
      out->scalar<tensorflow::ResourceHandle>()() =
          tensorflow::MakeResourceHandle<TableBase>(ctx, handle.container(), name);
    });
  }

 private:
  int64_t group_ = 1;
};

// Base of FindGroups / UpsertGroups: the groups attr; Prepare adds the slot
// groups of the fills input where missing.
class GroupsOp : public TableOp {
 public:
  explicit GroupsOp(OpKernelConstruction* c) : TableOp(c) {
    std::vector<int32_t> groups;
    OP_REQUIRES_OK(c, c->GetAttr("groups", &groups));
    for (int32_t g : groups) {
      OP_REQUIRES(c, g >= 0 && g < kMaxGroups,
                  absl::InvalidArgumentError(absl::StrCat("groups must be in [0, ", kMaxGroups, "), got ", g)));
      groups_.push_back(g);
    }
  }

 protected:
  Status Prepare(OpKernelContext* ctx, TableBase* t, int fills_input) {
    TF_RETURN_IF_ERROR(CheckKeys(ctx->input(1)));
    std::vector<double> fills;
    TF_RETURN_IF_ERROR(ReadFills(ctx->input(fills_input), &fills));
    return t->EnsureGroups(fills);
  }
  std::vector<int> groups_;
};

class FindGroupsOp : public GroupsOp {
 public:
  using GroupsOp::GroupsOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, Prepare(ctx, t, 2));
    const int64_t n = ctx->input(1).dim_size(0);
    const int count = static_cast<int>(groups_.size());
    OP_REQUIRES(ctx, ctx->num_outputs() == count + 1,
                absl::InvalidArgumentError(absl::StrCat("N must be len(groups) = ", count)));
    std::vector<Tensor*> values(count);
    for (int j = 0; j < count; ++j) OP_REQUIRES_OK(ctx, AllocRows(ctx, j, n, t->dim(), &values[j]));
    Tensor* exists;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(count, TensorShape({n}), &exists));
    OP_REQUIRES_OK(ctx, t->FindGroups(ctx, ctx->input(1), groups_, values, exists));
  }
};

class UpsertGroupsOp : public GroupsOp {
 public:
  using GroupsOp::GroupsOp;
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const int count = static_cast<int>(groups_.size());
    OP_REQUIRES(ctx, ctx->num_inputs() == count + 3,
                absl::InvalidArgumentError(absl::StrCat("N must be len(groups) = ", count)));
    OP_REQUIRES_OK(ctx, Prepare(ctx, t, count + 2));
    const Tensor& keys = ctx->input(1);
    std::vector<const Tensor*> values(count);
    for (int j = 0; j < count; ++j) {
      values[j] = &ctx->input(2 + j);
      OP_REQUIRES_OK(ctx, CheckRows("values", *values[j], keys.dim_size(0), t->dim()));
    }
    OP_REQUIRES_OK(ctx, t->UpsertGroups(ctx, keys, groups_, values));
  }
};

#define TFRA_DE_KERNEL(name, cls) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), cls)

TFRA_DE_KERNEL("TfraDeTable", TableHandleOp);
TFRA_DE_KERNEL("TfraDeFind", FindOp);
TFRA_DE_KERNEL("TfraDeContains", ContainsOp);
TFRA_DE_KERNEL("TfraDeFindInit", FindInitOp);
TFRA_DE_KERNEL("TfraDeInsertMissing", InsertMissingOp);
TFRA_DE_KERNEL("TfraDeInsert", InsertOp);
TFRA_DE_KERNEL("TfraDeAccum", AccumOp);
TFRA_DE_KERNEL("TfraDeRemove", RemoveOp);
TFRA_DE_KERNEL("TfraDeClear", ClearOp);
TFRA_DE_KERNEL("TfraDeSize", SizeOp);
TFRA_DE_KERNEL("TfraDeMemory", MemoryOp);
TFRA_DE_KERNEL("TfraDeMemoryParts", MemoryPartsOp);
TFRA_DE_KERNEL("TfraDeExport", ExportOp);
TFRA_DE_KERNEL("TfraDeImport", ImportOp);
TFRA_DE_KERNEL("TfraDeSetStep", SetStepOp);
TFRA_DE_KERNEL("TfraDeSetBound", SetBoundOp);
TFRA_DE_KERNEL("TfraDeEvict", EvictOp);
TFRA_DE_KERNEL("TfraDeSaveToFile", SaveToFileOp);
TFRA_DE_KERNEL("TfraDeLoadFromFile", LoadFromFileOp);
TFRA_DE_KERNEL("TfraDeGroupView", GroupViewOp);
TFRA_DE_KERNEL("TfraDeFindGroups", FindGroupsOp);
TFRA_DE_KERNEL("TfraDeUpsertGroups", UpsertGroupsOp);

}  // namespace
}  // namespace tfra_de

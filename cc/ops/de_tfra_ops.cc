// TFRA's table op names (the "TFRA>CuckooHashTable*" ops) over this library's
// native table, so that graphs and SavedModels that TFRA wrote load and run here
// (with TFRA's data-flow ops, de_tfra_data_flow.cc): a model exported by TFRA
// creates, restores and looks up its tables through these kernels. The
// signatures (inputs, outputs, attrs) are TFRA's, as its graphs name them; the
// semantics follow TFRA's kernels: Import replaces the content, Accum adds a
// delta where the caller saw the key and inserts where it did not (and leaves
// keys another writer changed), keys of any shape look up rows of
// keys.shape + [dim], SaveToFileSystem / LoadFromFileSystem write and read
// TFRA's raw `<name>-keys` / `<name>-values` arrays (numeric keys; a load
// inserts, all files read before any row is). Rows are [dim] of a float type,
// or of int32/int64 (TFRA's restrict-policy status tables).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_kernel.h"
#include "de_table.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"
#include "tensorflow/core/platform/path.h"

namespace tfra_de {
namespace {

using tensorflow::PartialTensorShape;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeAndType;
using tensorflow::shape_inference::ShapeHandle;

// ------------------------------------------------------------ shape fns --

// The table's rows' shape, from the handle's shape-and-type data when the
// graph carries it, else from the last dimension of `rows_input` (unknown if
// that is -1 or of unknown rank).
ShapeHandle RowShape(InferenceContext* c, int rows_input) {
  const auto* handle = c->input_handle_shapes_and_types(0);
  if (handle != nullptr && handle->size() == 2) return (*handle)[1].shape;
  if (rows_input >= 0 && c->RankKnown(c->input(rows_input)) && c->Rank(c->input(rows_input)) >= 1) {
    const ShapeHandle rows = c->input(rows_input);
    return c->Vector(c->Dim(rows, c->Rank(rows) - 1));
  }
  return c->UnknownShape();
}

Status LookupShape(InferenceContext* c) {
  ShapeHandle handle, out;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &handle));
  TF_RETURN_IF_ERROR(c->Concatenate(c->input(1), RowShape(c, 2), &out));
  c->set_output(0, out);
  if (c->num_outputs() > 1) c->set_output(1, c->input(1));
  return absl::OkStatus();
}

Status HandleOnlyShape(InferenceContext* c) {
  ShapeHandle handle;
  return c->WithRank(c->input(0), 0, &handle);
}

// --------------------------------------------------------- registrations --

REGISTER_OP("TFRA>CuckooHashTableOfTensors")
    .Output("table_handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .Attr("value_shape: shape = {}")
    .Attr("init_size: int = 0")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      PartialTensorShape value_shape;
      TF_RETURN_IF_ERROR(c->GetAttr("value_shape", &value_shape));
      ShapeHandle rows;
      TF_RETURN_IF_ERROR(c->MakeShapeFromPartialTensorShape(value_shape, &rows));
      DataType key_dtype, value_dtype;
      TF_RETURN_IF_ERROR(c->GetAttr("key_dtype", &key_dtype));
      TF_RETURN_IF_ERROR(c->GetAttr("value_dtype", &value_dtype));
      c->set_output(0, c->Scalar());
      c->set_output_handle_shapes_and_types(
          0, std::vector<ShapeAndType>{{c->Scalar(), key_dtype}, {rows, value_dtype}});
      return absl::OkStatus();
    })
    .Doc("TFRA's table op: a native table of key_dtype -> value_shape ([dim]) rows.");

REGISTER_OP("TFRA>CuckooHashTableFind")
    .Input("table_handle: resource")
    .Input("keys: Tin")
    .Input("default_value: Tout")
    .Output("values: Tout")
    .Attr("Tin: type")
    .Attr("Tout: type")
    .SetIsStateful()
    .SetShapeFn(LookupShape)
    .Doc("Rows of keys (keys.shape + [dim]); a missing key gets default_value ([dim], or "
         "its own row).");

REGISTER_OP("TFRA>CuckooHashTableFindWithExists")
    .Input("table_handle: resource")
    .Input("keys: Tin")
    .Input("default_value: Tout")
    .Output("values: Tout")
    .Output("exists: bool")
    .Attr("Tin: type")
    .Attr("Tout: type")
    .SetIsStateful()
    .SetShapeFn(LookupShape)
    .Doc("As TFRA>CuckooHashTableFind, and whether each key is present.");

REGISTER_OP("TFRA>CuckooHashTableInsert")
    .Input("table_handle: resource")
    .Input("keys: Tin")
    .Input("values: Tout")
    .Attr("Tin: type")
    .Attr("Tout: type")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Upserts keys -> values (keys.shape + [dim]).");

REGISTER_OP("TFRA>CuckooHashTableAccum")
    .Input("table_handle: resource")
    .Input("keys: key_dtype")
    .Input("values_or_deltas: value_dtype")
    .Input("exists: bool")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Where exists[i] and the key is present: adds the delta; where not exists[i] and "
         "the key is absent: inserts the value; other keys are left alone.");

REGISTER_OP("TFRA>CuckooHashTableRemove")
    .Input("table_handle: resource")
    .Input("keys: Tin")
    .Attr("Tin: type")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Deletes keys.");

REGISTER_OP("TFRA>CuckooHashTableClear")
    .Input("table_handle: resource")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Removes every key.");

REGISTER_OP("TFRA>CuckooHashTableSize")
    .Input("table_handle: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Number of keys.");

REGISTER_OP("TFRA>CuckooHashTableExport")
    .Input("table_handle: resource")
    .Output("keys: Tkeys")
    .Output("values: Tvalues")
    .Attr("Tkeys: type")
    .Attr("Tvalues: type")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle handle, rows;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 0, &handle));
      const ShapeHandle keys = c->Vector(InferenceContext::kUnknownDim);
      TF_RETURN_IF_ERROR(c->Concatenate(keys, RowShape(c, -1), &rows));
      c->set_output(0, keys);
      c->set_output(1, rows);
      return absl::OkStatus();
    })
    .Doc("Every key and its row.");

REGISTER_OP("TFRA>CuckooHashTableImport")
    .Input("table_handle: resource")
    .Input("keys: Tin")
    .Input("values: Tout")
    .Attr("Tin: type")
    .Attr("Tout: type")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Replaces the table's content by keys -> values.");

REGISTER_OP("TFRA>CuckooHashTableSaveToFileSystem")
    .Input("table_handle: resource")
    .Input("dirpath: string")
    .Input("file_name: string")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .Attr("dirpath_env: string")
    .Attr("append_to_file: bool")
    .Attr("buffer_size: int >= 1")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Writes the table as TFRA's raw arrays <dir>/<file_name>-keys and -values (the "
         "directory from the environment variable named dirpath_env when it is set).");

REGISTER_OP("TFRA>CuckooHashTableLoadFromFileSystem")
    .Input("table_handle: resource")
    .Input("dirpath: string")
    .Input("file_name: string")
    .Attr("key_dtype: type")
    .Attr("value_dtype: type")
    .Attr("dirpath_env: string")
    .Attr("load_entire_dir: bool")
    .Attr("buffer_size: int >= 1")
    .SetIsStateful()
    .SetShapeFn(HandleOnlyShape)
    .Doc("Inserts the rows of TFRA's <dir>/<file_name>-keys and -values, or with "
         "load_entire_dir those of every file of the variable (<prefix>_mht_*) in the directory.");

// --------------------------------------------------------------- kernels --

TensorShape RowsOf(const TensorShape& keys, int64_t dim) {
  TensorShape shape = keys;
  shape.AddDim(dim);
  return shape;
}

// A TFRA table op: the handle is resolved by TableOp; TFRA names the key and
// value dtype attrs per op.
class TfraTableOp : public TableOp {
 public:
  TfraTableOp(OpKernelConstruction* c, const char* key_attr, const char* value_attr) : TableOp(c) {
    if (key_attr != nullptr) OP_REQUIRES_OK(c, c->GetAttr(key_attr, &key_dtype_));
    if (value_attr != nullptr) OP_REQUIRES_OK(c, c->GetAttr(value_attr, &value_dtype_));
  }
};

class TfraFindOp : public TfraTableOp {
 public:
  TfraFindOp(OpKernelConstruction* c, bool with_exists)
      : TfraTableOp(c, "Tin", "Tout"), with_exists_(with_exists) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& dflt = ctx->input(2);
    const int64_t n = keys.NumElements(), dim = t->dim();
    Tensor flat_keys, defaults, flat_values, flat_exists;
    OP_REQUIRES_OK(ctx, Reshaped(keys, TensorShape({n}), "keys", &flat_keys));
    if (dflt.NumElements() == dim) {
      OP_REQUIRES_OK(ctx, Reshaped(dflt, TensorShape({dim}), "default_value", &defaults));
    } else {
      OP_REQUIRES_OK(ctx, Reshaped(dflt, TensorShape({n, dim}), "default_value", &defaults));
    }
    Tensor* values;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, RowsOf(keys.shape(), dim), &values));
    OP_REQUIRES_OK(ctx, Reshaped(*values, TensorShape({n, dim}), "values", &flat_values));
    Tensor* exists = &flat_exists;
    if (with_exists_) {
      OP_REQUIRES_OK(ctx, ctx->allocate_output(1, keys.shape(), &exists));
      OP_REQUIRES_OK(ctx, Reshaped(*exists, TensorShape({n}), "exists", &flat_exists));
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_BOOL, TensorShape({n}), &flat_exists));
    }
    OP_REQUIRES_OK(ctx, t->Find(ctx, flat_keys, defaults, &flat_values, &flat_exists, 0));
  }

 private:
  bool with_exists_;
};

class TfraInsertOp : public TfraTableOp {
 public:
  TfraInsertOp(OpKernelConstruction* c, bool replace)
      : TfraTableOp(c, "Tin", "Tout"), replace_(replace) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const int64_t n = keys.NumElements(), dim = t->dim();
    Tensor flat_keys, rows;
    OP_REQUIRES_OK(ctx, Reshaped(keys, TensorShape({n}), "keys", &flat_keys));
    OP_REQUIRES_OK(ctx, Reshaped(ctx->input(2), TensorShape({n, dim}), "values", &rows));
    if (replace_) {
      const Tensor none(tensorflow::DT_INT64, TensorShape({0}));
      OP_REQUIRES_OK(ctx, t->Import(ctx, flat_keys, rows, none, none, /*clear_first=*/true, 0));
    } else {
      OP_REQUIRES_OK(ctx, t->Insert(ctx, flat_keys, rows, 0));
    }
  }

 private:
  bool replace_;
};

class TfraAccumOp : public TfraTableOp {
 public:
  explicit TfraAccumOp(OpKernelConstruction* c) : TfraTableOp(c, nullptr, nullptr) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    const Tensor& keys = ctx->input(1);
    const int64_t n = keys.NumElements(), dim = t->dim();
    Tensor flat_keys, rows, seen;
    OP_REQUIRES_OK(ctx, Reshaped(keys, TensorShape({n}), "keys", &flat_keys));
    OP_REQUIRES_OK(ctx, Reshaped(ctx->input(2), TensorShape({n, dim}), "values_or_deltas", &rows));
    OP_REQUIRES_OK(ctx, Reshaped(ctx->input(3), TensorShape({n}), "exists", &seen));
    Tensor present;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_BOOL, TensorShape({n}), &present));
    OP_REQUIRES_OK(ctx, t->Contains(ctx, flat_keys, &present, 0));
    std::vector<int64_t> add, put;
    const bool* s = seen.flat<bool>().data();
    const bool* p = present.flat<bool>().data();
    for (int64_t i = 0; i < n; ++i) {
      if (s[i] && p[i]) add.push_back(i);
      if (!s[i] && !p[i]) put.push_back(i);
    }
    Tensor k, v;
    OP_REQUIRES_OK(ctx, Pick(ctx, flat_keys, rows, add, &k, &v));
    OP_REQUIRES_OK(ctx, t->Accum(ctx, k, v, 0));
    OP_REQUIRES_OK(ctx, Pick(ctx, flat_keys, rows, put, &k, &v));
    OP_REQUIRES_OK(ctx, t->Insert(ctx, k, v, 0));
  }

 private:
  static Status Pick(OpKernelContext* ctx, const Tensor& keys, const Tensor& rows,
                     const std::vector<int64_t>& at, Tensor* k, Tensor* v) {
    const int64_t m = static_cast<int64_t>(at.size());
    TF_RETURN_IF_ERROR(ctx->allocate_temp(keys.dtype(), TensorShape({m}), k));
    TF_RETURN_IF_ERROR(ctx->allocate_temp(rows.dtype(), TensorShape({m, rows.dim_size(1)}), v));
    const SliceCopier key_copy(keys, k), row_copy(rows, v);
    for (int64_t j = 0; j < m; ++j) {
      key_copy.Copy(at[j], j);
      row_copy.Copy(at[j], j);
    }
    return absl::OkStatus();
  }
};

class TfraRemoveOp : public TfraTableOp {
 public:
  explicit TfraRemoveOp(OpKernelConstruction* c) : TfraTableOp(c, "Tin", nullptr) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    Tensor flat_keys;
    OP_REQUIRES_OK(ctx, Reshaped(ctx->input(1), TensorShape({ctx->input(1).NumElements()}), "keys",
                                 &flat_keys));
    int64_t removed = 0;
    OP_REQUIRES_OK(ctx, t->Remove(ctx, flat_keys, &removed));
  }
};

class TfraClearOp : public TfraTableOp {
 public:
  explicit TfraClearOp(OpKernelConstruction* c) : TfraTableOp(c, nullptr, nullptr) {}
  void Run(OpKernelContext*, TableBase* t) override { t->Clear(0); }
};

class TfraSizeOp : public TfraTableOp {
 public:
  explicit TfraSizeOp(OpKernelConstruction* c) : TfraTableOp(c, nullptr, nullptr) {}
  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES_OK(ctx, SetScalarOutput(ctx, 0, t->Size()));
  }
};

class TfraExportOp : public TfraTableOp {
 public:
  explicit TfraExportOp(OpKernelConstruction* c) : TfraTableOp(c, "Tkeys", "Tvalues") {}

  class Sink : public ExportSink {
   public:
    Sink(OpKernelContext* ctx, int64_t dim) : ctx_(ctx), dim_(dim) {}
    Status Allocate(int64_t n, Tensor** keys, Tensor** values, Tensor** stamps, Tensor** freqs) override {
      TF_RETURN_IF_ERROR(ctx_->allocate_output(0, TensorShape({n}), keys));
      TF_RETURN_IF_ERROR(ctx_->allocate_output(1, TensorShape({n, dim_}), values));
      TF_RETURN_IF_ERROR(ctx_->allocate_temp(tensorflow::DT_INT64, TensorShape({n}), &stamps_));
      TF_RETURN_IF_ERROR(ctx_->allocate_temp(tensorflow::DT_INT64, TensorShape({n}), &freqs_));
      *stamps = &stamps_;
      *freqs = &freqs_;
      return absl::OkStatus();
    }

   private:
    OpKernelContext* ctx_;
    int64_t dim_;
    Tensor stamps_, freqs_;
  };

  void Run(OpKernelContext* ctx, TableBase* t) override {
    Sink sink(ctx, t->dim());
    int64_t next = -1;
    OP_REQUIRES_OK(ctx, t->Export(0, -1, &sink, &next, 0));
  }
};

// TFRA's FileSystemSaver files: per table `<path>-keys` (the keys' raw bytes)
// and `<path>-values` (the rows' raw bytes), native byte order.
class TfraFileOp : public TfraTableOp {
 public:
  explicit TfraFileOp(OpKernelConstruction* c) : TfraTableOp(c, nullptr, nullptr) {
    OP_REQUIRES_OK(c, c->GetAttr("dirpath_env", &dirpath_env_));
  }

  void Run(OpKernelContext* ctx, TableBase* t) override {
    OP_REQUIRES(ctx, t->key_dtype() != tensorflow::DT_STRING,
                absl::UnimplementedError("TFRA's file format holds numeric keys only, not strings"));
    OP_REQUIRES_OK(ctx, CheckScalar("dirpath", ctx->input(1)));
    OP_REQUIRES_OK(ctx, CheckScalar("file_name", ctx->input(2)));
    // The directory: from the environment variable dirpath_env names when set, as in TFRA.
    const char* from_env = dirpath_env_.empty() ? nullptr : std::getenv(dirpath_env_.c_str());
    const std::string dir = from_env != nullptr
                                ? std::string(from_env)
                                : std::string(ctx->input(1).scalar<tensorflow::tstring>()());
    RunFiles(ctx, t, dir, std::string(ctx->input(2).scalar<tensorflow::tstring>()()));
  }

 protected:
  virtual void RunFiles(OpKernelContext* ctx, TableBase* t, const std::string& dir,
                        const std::string& name) = 0;

 private:
  std::string dirpath_env_;
};

class TfraSaveToFileSystemOp : public TfraFileOp {
 public:
  explicit TfraSaveToFileSystemOp(OpKernelConstruction* c) : TfraFileOp(c) {
    OP_REQUIRES_OK(c, c->GetAttr("append_to_file", &append_));
  }
  void RunFiles(OpKernelContext* ctx, TableBase* t, const std::string& dir,
                const std::string& name) override {
    HostSink sink(t->config(), 1);
    int64_t next = -1;
    OP_REQUIRES_OK(ctx, t->Export(0, -1, &sink, &next, 0));
    tensorflow::Env* env = ctx->env();
    const std::string path = tensorflow::io::JoinPath(dir, name);
    OP_REQUIRES_OK(ctx, env->RecursivelyCreateDir(dir));
    OP_REQUIRES_OK(ctx, Write(env, path + "-keys", sink.keys.tensor_data()));
    OP_REQUIRES_OK(ctx, Write(env, path + "-values", sink.values.tensor_data()));
  }

 private:
  // Appends, or writes a temporary file renamed over `path` once complete.
  Status Write(tensorflow::Env* env, const std::string& path, absl::string_view bytes) const {
    std::unique_ptr<tensorflow::WritableFile> file;
    const std::string target = append_ ? path : path + ".tmp";
    TF_RETURN_IF_ERROR(append_ ? env->NewAppendableFile(target, &file)
                               : env->NewWritableFile(target, &file));
    TF_RETURN_IF_ERROR(file->Append(bytes));
    TF_RETURN_IF_ERROR(file->Close());
    return append_ ? absl::OkStatus() : env->RenameFile(target, path);
  }

  bool append_ = false;
};

class TfraLoadFromFileSystemOp : public TfraFileOp {
 public:
  explicit TfraLoadFromFileSystemOp(OpKernelConstruction* c) : TfraFileOp(c) {
    OP_REQUIRES_OK(c, c->GetAttr("load_entire_dir", &entire_dir_));
  }
  void RunFiles(OpKernelContext* ctx, TableBase* t, const std::string& dir,
                const std::string& name) override {
    tensorflow::Env* env = ctx->env();
    std::vector<std::string> paths;
    if (entire_dir_) {  // every table file of the variable: <dir>/<name up to "_mht_">*
      const size_t at = name.rfind("_mht_");
      const std::string prefix = at == std::string::npos ? name : name.substr(0, at + 5);
      std::vector<std::string> files;
      OP_REQUIRES_OK(ctx, env->GetMatchingPaths(tensorflow::io::JoinPath(dir, prefix) + "*", &files));
      for (const std::string& f : files) {
        const size_t dash = f.rfind('-');
        if (dash != std::string::npos && (f.substr(dash) == "-keys" || f.substr(dash) == "-values")) {
          paths.push_back(f.substr(0, dash));
        }
      }
      std::sort(paths.begin(), paths.end());
      paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
      OP_REQUIRES(ctx, !paths.empty(),
                  absl::NotFoundError(absl::StrCat("no TFRA table files ", prefix, "*-keys in ", dir)));
    } else {
      paths.push_back(tensorflow::io::JoinPath(dir, name));
    }
    std::vector<std::pair<Tensor, Tensor>> rows;  // every file is read before any row is written
    for (const std::string& path : paths) {
      rows.emplace_back();
      OP_REQUIRES_OK(ctx, Read(env, path, t->config(), &rows.back().first, &rows.back().second));
    }
    for (const auto& kv : rows) OP_REQUIRES_OK(ctx, t->Insert(ctx, kv.first, kv.second, 0));
  }

 private:
  static Status Read(tensorflow::Env* env, const std::string& path, const TableConfig& cfg,
                     Tensor* keys, Tensor* values) {
    std::string key_bytes, value_bytes;
    TF_RETURN_IF_ERROR(tensorflow::ReadFileToString(env, path + "-keys", &key_bytes));
    TF_RETURN_IF_ERROR(tensorflow::ReadFileToString(env, path + "-values", &value_bytes));
    const size_t key_size = tensorflow::DataTypeSize(cfg.key_dtype);
    const size_t row_size = tensorflow::DataTypeSize(cfg.value_dtype) * static_cast<size_t>(cfg.dim);
    const size_t n = key_bytes.size() / key_size;
    if (key_bytes.size() % key_size != 0 || value_bytes.size() != n * row_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, "-keys holds ", key_bytes.size(), " bytes and -values ", value_bytes.size(),
          ": not ", key_size, "-byte keys each with a row of ", cfg.dim, " ",
          tensorflow::DataTypeString(cfg.value_dtype), " (", row_size, " bytes)"));
    }
    *keys = Tensor(cfg.key_dtype, TensorShape({static_cast<int64_t>(n)}));
    *values = Tensor(cfg.value_dtype, TensorShape({static_cast<int64_t>(n), cfg.dim}));
    std::memcpy(const_cast<char*>(keys->tensor_data().data()), key_bytes.data(), key_bytes.size());
    std::memcpy(const_cast<char*>(values->tensor_data().data()), value_bytes.data(), value_bytes.size());
    return absl::OkStatus();
  }

  bool entire_dir_ = false;
};

#define TFRA_DE_TFRA_KERNEL(name, ...) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(tensorflow::DEVICE_CPU), __VA_ARGS__)

class TfraFindOnlyOp : public TfraFindOp {
 public:
  explicit TfraFindOnlyOp(OpKernelConstruction* c) : TfraFindOp(c, false) {}
};
class TfraFindWithExistsOp : public TfraFindOp {
 public:
  explicit TfraFindWithExistsOp(OpKernelConstruction* c) : TfraFindOp(c, true) {}
};
class TfraUpsertOp : public TfraInsertOp {
 public:
  explicit TfraUpsertOp(OpKernelConstruction* c) : TfraInsertOp(c, false) {}
};
class TfraImportOp : public TfraInsertOp {
 public:
  explicit TfraImportOp(OpKernelConstruction* c) : TfraInsertOp(c, true) {}
};

TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableOfTensors", TableHandleOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableFind", TfraFindOnlyOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableFindWithExists", TfraFindWithExistsOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableInsert", TfraUpsertOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableAccum", TfraAccumOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableRemove", TfraRemoveOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableClear", TfraClearOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableSize", TfraSizeOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableExport", TfraExportOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableImport", TfraImportOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableSaveToFileSystem", TfraSaveToFileSystemOp);
TFRA_DE_TFRA_KERNEL("TFRA>CuckooHashTableLoadFromFileSystem", TfraLoadFromFileSystemOp);

}  // namespace
}  // namespace tfra_de

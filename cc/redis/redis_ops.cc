// Op registrations and CPU kernels of the Redis tables (library
// _tfra_de_redis_ops.so, loaded by tfra_dynamic_embedding/tables/redis.py).
// Every input is checked and every failure -- a dead server included -- is a
// Status naming what went wrong; nothing here can crash the process.
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/redis/redis_backend.h"
#include "cc/redis/redis_table.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/threadpool.h"

namespace tfra_de {
namespace redis {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::TensorShape;
using tensorflow::TensorShapeUtils;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

constexpr int kClusterMode = 0;
constexpr int kSentinelMode = 1;
constexpr int kStandaloneMode = 2;

#define TFRA_DE_REDIS_TYPE_ATTRS                  \
  Attr("key_dtype: {int32, int64, string}")       \
      .Attr("value_dtype: {half, bfloat16, float, double}")

Status RowsShape(InferenceContext* c, int idx) {
  ShapeHandle keys;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &keys));
  int64_t dim;
  TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
  c->set_output(idx, c->Matrix(c->Dim(keys, 0), dim));
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

REGISTER_OP("TfraDeRedisTable")
    .Output("table: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .Attr("connection_mode: int = 2")
    .Attr("hosts: list(string)")
    .Attr("ports: list(int)")
    .Attr("user: string = ''")
    .Attr("password_file: string = ''")
    .Attr("db: int = 0")
    .Attr("connect_timeout_ms: int = 1000")
    .Attr("socket_timeout_ms: int = 1000")
    .Attr("pool_size: int = 20")
    .Attr("wait_timeout_ms: int = 100000000")
    .Attr("keep_alive: bool = false")
    .Attr("master_name: string = 'master'")
    .Attr("sentinel_user: string = ''")
    .Attr("sentinel_connect_timeout_ms: int = 1000")
    .Attr("sentinel_socket_timeout_ms: int = 1000")
    .Attr("hash_names: list(string)")
    .Attr("using_hash_storage_slice: bool = false")
    .Attr("keys_sending_size: int = 1024")
    .Attr("expire_seconds: int = -1")
    .Attr("follow_config: bool = false")
    .Attr("config_env: list(string) = []")
    .Attr("model_tag: string = ''")
    .Attr("md5_prefix: bool = false")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("A table of key -> [dim] rows kept in Redis hashes (hash_names: one per storage slice, "
         "TFRA's layout). The passwords are read from password_file (TFRA's JSON config, fields "
         "redis_password, redis_sentinel_password) when the table is created, so they are never "
         "part of a graph. connection_mode: 0 cluster, 1 sentinel (hosts are the sentinels), "
         "2 standalone. With follow_config the config file is read again when the table is "
         "created (a SavedModel loaded elsewhere): the first of the environment variables "
         "config_env that is set names it, else password_file; its connection fields replace "
         "the attrs, and its model_tag_runtime replaces model_tag in hash_names (unless "
         "md5_prefix).");

REGISTER_OP("TfraDeRedisFind")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("default_values: value_dtype")
    .Output("values: value_dtype")
    .Output("exists: bool")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(RowsShape(c, 0));
      c->set_output(1, c->Vector(c->Dim(c->input(1), 0)));
      return absl::OkStatus();
    })
    .Doc("Rows of keys; a missing key gets default_values ([dim] or its row of [N, dim]).");

REGISTER_OP("TfraDeRedisInsert")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(UpdateShape)
    .Doc("Upsert; with duplicate keys the last row wins.");

REGISTER_OP("TfraDeRedisAccum")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("deltas: value_dtype")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(UpdateShape)
    .Doc("rows += deltas on the server (a missing key is inserted with its delta).");

REGISTER_OP("TfraDeRedisInsertMissing")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .Output("stored: value_dtype")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(UpdateShape(c));
      return RowsShape(c, 0);
    })
    .Doc("Inserts absent keys with values; stored: the row each key has afterwards.");

REGISTER_OP("TfraDeRedisRemove")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Output("removed: int64")
    .Attr("key_dtype: {int32, int64, string}")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape)
    .Doc("Deletes keys; removed: how many were present.");

REGISTER_OP("TfraDeRedisSize")
    .Input("table: resource")
    .Output("size: int64")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::ScalarShape);

REGISTER_OP("TfraDeRedisClear")
    .Input("table: resource")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs);

REGISTER_OP("TfraDeRedisExport")
    .Input("table: resource")
    .Output("keys: key_dtype")
    .Output("values: value_dtype")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      int64_t dim;
      TF_RETURN_IF_ERROR(c->GetAttr("dim", &dim));
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      c->set_output(1, c->Matrix(InferenceContext::kUnknownDim, dim));
      return absl::OkStatus();
    })
    .Doc("Every key and row of the table (each key once).");

REGISTER_OP("TfraDeRedisImport")
    .Input("table: resource")
    .Input("keys: key_dtype")
    .Input("values: value_dtype")
    .TFRA_DE_REDIS_TYPE_ATTRS
    .Attr("dim: int >= 1")
    .SetIsStateful()
    .SetShapeFn(UpdateShape)
    .Doc("Replaces the table's content with keys/values.");

REGISTER_OP("TfraDeRedisDump")
    .Input("table: resource")
    .Input("directory: string")
    .Output("files: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Vector(InferenceContext::kUnknownDim));
      return absl::OkStatus();
    })
    .Doc("TFRA's table_store_mode 1: each slice's Redis DUMP written to "
         "<directory>/<hash name>.rdb; files: their paths, in slice order.");

REGISTER_OP("TfraDeRedisRestore")
    .Input("table: resource")
    .Input("files: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Restores slice i from files[i] (TfraDeRedisDump's), replacing the hash; reads only.");

template <class Fn>
void Guarded(OpKernelContext* ctx, Fn&& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    ctx->CtxFailure(__FILE__, __LINE__, absl::ResourceExhaustedError("out of memory in a Redis table op"));
  } catch (const std::exception& e) {
    ctx->CtxFailure(__FILE__, __LINE__, absl::InternalError(absl::StrCat("Redis table op: ", e.what())));
  }
}

class RedisTableHandleOp : public OpKernel {
 public:
  explicit RedisTableHandleOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("container", &container_));
    OP_REQUIRES_OK(c, c->GetAttr("shared_name", &name_));
    bool node_name_sharing = false;
    OP_REQUIRES_OK(c, c->GetAttr("use_node_name_sharing", &node_name_sharing));
    if (name_.empty()) {
      // As the native tables: shared by node name in a graph (every worker that
      // builds it sees one table object), else private to this kernel.
      static std::atomic<int64_t> counter{0};
      private_ = !node_name_sharing;
      name_ = private_ ? absl::StrCat("_tfra_de_redis_private_", counter.fetch_add(1), "_", def().name())
                       : absl::StrCat("tfra_de_redis_", def().name());
    }
    OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &table_.key_dtype));
    OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &table_.value_dtype));
    OP_REQUIRES_OK(c, c->GetAttr("dim", &table_.dim));
    OP_REQUIRES_OK(c, c->GetAttr("connection_mode", &conn_.mode));
    OP_REQUIRES_OK(c, c->GetAttr("hosts", &conn_.hosts));
    std::vector<int32_t> ports;
    OP_REQUIRES_OK(c, c->GetAttr("ports", &ports));
    conn_.ports.assign(ports.begin(), ports.end());
    OP_REQUIRES_OK(c, c->GetAttr("user", &conn_.base.user));
    OP_REQUIRES_OK(c, c->GetAttr("password_file", &password_file_));
    OP_REQUIRES_OK(c, c->GetAttr("db", &conn_.base.db));
    OP_REQUIRES_OK(c, c->GetAttr("connect_timeout_ms", &conn_.base.connect_timeout_ms));
    OP_REQUIRES_OK(c, c->GetAttr("socket_timeout_ms", &conn_.base.socket_timeout_ms));
    OP_REQUIRES_OK(c, c->GetAttr("pool_size", &conn_.base.pool_size));
    OP_REQUIRES_OK(c, c->GetAttr("wait_timeout_ms", &conn_.base.wait_timeout_ms));
    OP_REQUIRES_OK(c, c->GetAttr("keep_alive", &conn_.base.keep_alive));
    OP_REQUIRES_OK(c, c->GetAttr("master_name", &conn_.master_name));
    OP_REQUIRES_OK(c, c->GetAttr("sentinel_user", &conn_.sentinel.user));
    OP_REQUIRES_OK(c, c->GetAttr("sentinel_connect_timeout_ms", &conn_.sentinel.connect_timeout_ms));
    OP_REQUIRES_OK(c, c->GetAttr("sentinel_socket_timeout_ms", &conn_.sentinel.socket_timeout_ms));
    OP_REQUIRES_OK(c, c->GetAttr("hash_names", &table_.hashes));
    OP_REQUIRES(c, !table_.hashes.empty(),
                absl::InvalidArgumentError("hash_names must name at least one hash (storage_slice >= 1)"));
    OP_REQUIRES_OK(c, c->GetAttr("using_hash_storage_slice", &table_.hash_slices));
    OP_REQUIRES_OK(c, c->GetAttr("keys_sending_size", &table_.keys_per_command));
    OP_REQUIRES(c, table_.keys_per_command >= 1,
                absl::InvalidArgumentError(absl::StrCat("keys_sending_size must be >= 1, got ",
                                                        table_.keys_per_command)));
    OP_REQUIRES_OK(c, c->GetAttr("expire_seconds", &table_.expire_seconds));
    OP_REQUIRES_OK(c, c->GetAttr("follow_config", &follow_config_));
    OP_REQUIRES_OK(c, c->GetAttr("config_env", &config_env_));
    OP_REQUIRES_OK(c, c->GetAttr("model_tag", &model_tag_));
    OP_REQUIRES_OK(c, c->GetAttr("md5_prefix", &md5_prefix_));
    // The attrs are checked now (a bad graph fails at once); a config file read
    // at creation is checked then.
    std::vector<ServerOptions> servers;
    ServerOptions master;
    OP_REQUIRES_OK(c, Servers(conn_, &servers, &master));
  }

  ~RedisTableHandleOp() override {
    if (private_ && rm_ != nullptr) rm_->Delete<RedisTable>(resolved_container_, name_).IgnoreError();
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
      RedisTable* table = nullptr;
      OP_REQUIRES_OK(ctx, rm->LookupOrCreate<RedisTable>(container, name_, &table,
                                                         [this](RedisTable** out) { return Create(out); }));
      tensorflow::core::ScopedUnref unref(table);
      const TableOptions& have = table->options();
      OP_REQUIRES(ctx,
                  have.key_dtype == table_.key_dtype && have.value_dtype == table_.value_dtype &&
                      have.dim == table_.dim,
                  absl::InvalidArgumentError(absl::StrCat(
                      "shared_name '", name_, "' already names a Redis table of ",
                      tensorflow::DataTypeString(have.key_dtype), " -> ",
                      tensorflow::DataTypeString(have.value_dtype), "[", have.dim, "]")));
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
      out->scalar<tensorflow::ResourceHandle>()() =
          tensorflow::MakeResourceHandle<RedisTable>(ctx, container, name_);
    });
  }

 private:
  // The connection settings of the attrs, or of TFRA's config file.
  struct Conn {
    int64_t mode = kStandaloneMode;
    std::vector<std::string> hosts;
    std::vector<int64_t> ports;
    ServerOptions base;      // user, db, timeouts, pool (of the servers / the master)
    ServerOptions sentinel;  // sentinel mode: user and timeouts of the sentinels
    std::string master_name;
  };

  // The servers (cluster nodes, or sentinels) and the master's settings.
  static Status Servers(const Conn& conn, std::vector<ServerOptions>* servers, ServerOptions* master) {
    if (conn.mode != kClusterMode && conn.mode != kSentinelMode && conn.mode != kStandaloneMode) {
      return absl::InvalidArgumentError(absl::StrCat("redis_connection_mode ", conn.mode,
                                                     " is not one of 0 (cluster), 1 (sentinel), 2 (standalone)"));
    }
    if (conn.hosts.empty() || conn.hosts.size() != conn.ports.size()) {
      return absl::InvalidArgumentError(absl::StrCat("redis_host_ip (", conn.hosts.size(),
                                                     " entries) and redis_host_port (", conn.ports.size(),
                                                     ") must be non-empty lists of one length"));
    }
    if (conn.base.db < 0) return absl::InvalidArgumentError(absl::StrCat("redis_db must be >= 0, got ", conn.base.db));
    if (conn.base.pool_size < 1) {
      return absl::InvalidArgumentError(absl::StrCat("redis_conn_pool_size must be >= 1, got ", conn.base.pool_size));
    }
    ServerOptions base = conn.base;
    base.cluster = conn.mode == kClusterMode;
    *master = base;
    ServerOptions sentinel = base;  // a sentinel: its own user and timeouts, no db
    sentinel.user = conn.sentinel.user;
    sentinel.connect_timeout_ms = conn.sentinel.connect_timeout_ms;
    sentinel.socket_timeout_ms = conn.sentinel.socket_timeout_ms;
    sentinel.db = 0;
    servers->clear();
    for (size_t i = 0; i < conn.hosts.size(); ++i) {
      if (conn.ports[i] < 1 || conn.ports[i] > 65535) {
        return absl::InvalidArgumentError(absl::StrCat("redis_host_port must be in [1, 65535], got ", conn.ports[i]));
      }
      ServerOptions s = conn.mode == kSentinelMode ? sentinel : base;
      s.host = conn.hosts[i];
      s.port = static_cast<int>(conn.ports[i]);
      servers->push_back(s);
    }
    return absl::OkStatus();
  }

  // The config file follow_config reads: the first environment variable of
  // config_env that is set (TFRA's order), else password_file.
  std::string ConfigPath() const {
    for (const std::string& var : config_env_) {
      const char* v = var.empty() ? nullptr : std::getenv(var.c_str());
      if (v != nullptr && v[0] != '\0') return v;
    }
    return password_file_;
  }

  // follow_config: the file's connection fields over the attrs', and its model
  // tag in the hash names.
  Status FromConfigFile(const std::string* path, Conn* conn, TableOptions* table) {
    std::map<std::string, std::string> f;
    TF_RETURN_IF_ERROR(ReadJsonObject(*path, &f));
    int64_t v;
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_connection_mode", &conn->mode));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_host_ip", &conn->hosts));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_host_port", &conn->ports));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_user", &conn->base.user));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_master_name", &conn->master_name));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_sentinel_user", &conn->sentinel.user));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_connect_keep_alive", &conn->base.keep_alive));
    TF_RETURN_IF_ERROR(JsonField(f, *path, "redis_wait_timeout", &conn->base.wait_timeout_ms));
    auto int_field = [&](const char* name, int* out) -> Status {
      v = *out;
      TF_RETURN_IF_ERROR(JsonField(f, *path, name, &v));
      if (v < INT32_MIN || v > INT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("the Redis config file '", *path, "': ", name, " is out of range"));
      }
      *out = static_cast<int>(v);
      return absl::OkStatus();
    };
    TF_RETURN_IF_ERROR(int_field("redis_db", &conn->base.db));
    TF_RETURN_IF_ERROR(int_field("redis_connect_timeout", &conn->base.connect_timeout_ms));
    TF_RETURN_IF_ERROR(int_field("redis_socket_timeout", &conn->base.socket_timeout_ms));
    TF_RETURN_IF_ERROR(int_field("redis_conn_pool_size", &conn->base.pool_size));
    TF_RETURN_IF_ERROR(int_field("redis_sentinel_connect_timeout", &conn->sentinel.connect_timeout_ms));
    TF_RETURN_IF_ERROR(int_field("redis_sentinel_socket_timeout", &conn->sentinel.socket_timeout_ms));
    std::string tag = model_tag_;
    TF_RETURN_IF_ERROR(JsonField(f, *path, "model_tag_runtime", &tag));
    if (!md5_prefix_ && !model_tag_.empty() && tag != model_tag_) {
      const std::string old_prefix = model_tag_ + ":";
      for (std::string& h : table->hashes) {
        if (h.compare(0, old_prefix.size(), old_prefix) == 0) h = tag + ":" + h.substr(old_prefix.size());
      }
    }
    return absl::OkStatus();
  }

  // Connects now, so that a wrong address, password or db fails the table's
  // creation with a clear error instead of its first lookup.
  Status Create(RedisTable** out) {
    Conn conn = conn_;
    TableOptions table = table_;
    std::string path = password_file_;
    if (follow_config_) {
      path = ConfigPath();
      if (!path.empty()) TF_RETURN_IF_ERROR(FromConfigFile(&path, &conn, &table));
    }
    std::vector<ServerOptions> servers;
    ServerOptions master;
    TF_RETURN_IF_ERROR(Servers(conn, &servers, &master));
    table.spread_slices = conn.mode == kClusterMode;
    std::string password, sentinel_password;
    if (!path.empty()) {
      TF_RETURN_IF_ERROR(ReadJsonStringField(path, "redis_password", &password));
      if (conn.mode == kSentinelMode) {
        TF_RETURN_IF_ERROR(ReadJsonStringField(path, "redis_sentinel_password", &sentinel_password));
      }
    }
    for (auto& s : servers) s.password = conn.mode == kSentinelMode ? sentinel_password : password;
    master.password = password;
    std::unique_ptr<Backend> backend;
    if (conn.mode == kClusterMode) {
      backend = MakeCluster(servers);
    } else if (conn.mode == kSentinelMode) {
      backend = MakeSentinel(servers, master, conn.master_name);
    } else {
      backend = MakeStandalone(servers[0]);
    }
    if (!backend) return absl::InternalError("no Redis backend for this connection mode");
    TF_RETURN_IF_ERROR(backend->Check());
    *out = new RedisTable(table, std::move(backend));
    return absl::OkStatus();
  }

  std::string container_, name_, password_file_, model_tag_;
  TableOptions table_;
  Conn conn_;
  bool follow_config_ = false, md5_prefix_ = false;
  std::vector<std::string> config_env_;
  bool private_ = false;
  std::mutex mu_;
  tensorflow::ResourceMgr* rm_ = nullptr;
  std::string resolved_container_;
};

// Base of the kernels that take a table: resolves the handle, checks the
// table's dtypes and dim against the op's.
// OP_REQUIRES for the asynchronous table kernels (TF's macros refuse them):
// the failure is recorded and the body returns; ComputeAsync then calls done.
#define TFRA_DE_REQUIRES_OK(ctx, expr)                    \
  do {                                                    \
    const Status _tfra_de_s = (expr);                     \
    if (!_tfra_de_s.ok()) {                               \
      (ctx)->CtxFailure(__FILE__, __LINE__, _tfra_de_s);  \
      return;                                             \
    }                                                     \
  } while (0)
#define TFRA_DE_REQUIRES(ctx, cond, status)               \
  do {                                                    \
    if (!(cond)) {                                        \
      (ctx)->CtxFailure(__FILE__, __LINE__, (status));    \
      return;                                             \
    }                                                     \
  } while (0)

// The threads the table ops wait for Redis on. The ops are asynchronous: a
// table op that waits on the network holds none of TF's inter-op threads (as
// many as CPUs), so the independent Redis ops of a step (each table's lookup,
// its slots' reads and writes) wait side by side even on a small machine.
tensorflow::thread::ThreadPool* WaitPool() {
  static tensorflow::thread::ThreadPool* pool =
      new tensorflow::thread::ThreadPool(tensorflow::Env::Default(), "tfra_de_redis", 16);
  return pool;
}

class RedisTableOp : public tensorflow::AsyncOpKernel {
 public:
  explicit RedisTableOp(OpKernelConstruction* c) : AsyncOpKernel(c) {
    if (c->HasAttr("key_dtype")) OP_REQUIRES_OK(c, c->GetAttr("key_dtype", &key_dtype_));
    if (c->HasAttr("value_dtype")) OP_REQUIRES_OK(c, c->GetAttr("value_dtype", &value_dtype_));
    if (c->HasAttr("dim")) OP_REQUIRES_OK(c, c->GetAttr("dim", &dim_));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    WaitPool()->Schedule([this, ctx, done = std::move(done)] {
      ComputeSync(ctx);
      done();
    });
  }

  void ComputeSync(OpKernelContext* ctx) {
    Guarded(ctx, [&] {
      const Tensor& h = ctx->input(0);
      TFRA_DE_REQUIRES(ctx, h.dtype() == tensorflow::DT_RESOURCE && h.NumElements() == 1,
                  absl::InvalidArgumentError(absl::StrCat("table must be a scalar resource handle, got ",
                                                          h.shape().DebugString())));
      tensorflow::core::RefCountPtr<RedisTable> table;
      TFRA_DE_REQUIRES_OK(ctx, tensorflow::LookupResource(ctx, h.flat<tensorflow::ResourceHandle>()(0), &table));
      const TableOptions& t = table->options();
      TFRA_DE_REQUIRES(ctx,
                  (key_dtype_ == tensorflow::DT_INVALID || key_dtype_ == t.key_dtype) &&
                      (value_dtype_ == tensorflow::DT_INVALID || value_dtype_ == t.value_dtype) &&
                      (dim_ < 0 || dim_ == t.dim),
                  absl::InvalidArgumentError(absl::StrCat(
                      name(), ": op built for ", tensorflow::DataTypeString(key_dtype_), " -> ",
                      tensorflow::DataTypeString(value_dtype_), "[", dim_, "] but the table is ",
                      tensorflow::DataTypeString(t.key_dtype), " -> ",
                      tensorflow::DataTypeString(t.value_dtype), "[", t.dim, "]")));
      Run(ctx, table.get());
    });
  }

 protected:
  virtual void Run(OpKernelContext* ctx, RedisTable* table) = 0;

  static Status CheckKeys(const Tensor& keys) {
    if (!TensorShapeUtils::IsVector(keys.shape())) {
      return absl::InvalidArgumentError(
          absl::StrCat("keys must be a 1-D tensor, got shape ", keys.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  static Status CheckRows(const char* what, const Tensor& rows, int64_t n, int64_t dim) {
    if (rows.dims() != 2 || rows.dim_size(0) != n || rows.dim_size(1) != dim) {
      return absl::InvalidArgumentError(absl::StrCat(what, " must have shape [", n, ", ", dim,
                                                     "] (a row of dim ", dim, " per key), got ",
                                                     rows.shape().DebugString()));
    }
    return absl::OkStatus();
  }

  DataType key_dtype_ = tensorflow::DT_INVALID;
  DataType value_dtype_ = tensorflow::DT_INVALID;
  int64_t dim_ = -1;
};

class FindOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& defaults = ctx->input(2);
    TFRA_DE_REQUIRES_OK(ctx, CheckKeys(keys));
    const int64_t n = keys.dim_size(0);
    const int64_t dim = t->options().dim;
    const bool one = defaults.dims() == 1 && defaults.dim_size(0) == dim;
    TFRA_DE_REQUIRES(ctx, one || (defaults.dims() == 2 && defaults.dim_size(0) == n && defaults.dim_size(1) == dim),
                absl::InvalidArgumentError(absl::StrCat("default_values must have shape [", dim, "] or [", n,
                                                        ", ", dim, "], got ", defaults.shape().DebugString())));
    Tensor* values;
    Tensor* exists;
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, dim}), &values));
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({n}), &exists));
    TFRA_DE_REQUIRES_OK(ctx, t->Find(keys, defaults, values, exists));
  }
};

class InsertOp : public RedisTableOp {
 public:
  InsertOp(OpKernelConstruction* c, bool accum, bool replace) : RedisTableOp(c), accum_(accum), replace_(replace) {}
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    TFRA_DE_REQUIRES_OK(ctx, CheckKeys(keys));
    TFRA_DE_REQUIRES_OK(ctx, CheckRows(accum_ ? "deltas" : "values", values, keys.dim_size(0), t->options().dim));
    if (replace_) TFRA_DE_REQUIRES_OK(ctx, t->Clear());
    TFRA_DE_REQUIRES_OK(ctx, accum_ ? t->Accum(keys, values) : t->Insert(keys, values));
  }

 private:
  const bool accum_, replace_;
};

class PlainInsertOp : public InsertOp {
 public:
  explicit PlainInsertOp(OpKernelConstruction* c) : InsertOp(c, false, false) {}
};
class AccumOp : public InsertOp {
 public:
  explicit AccumOp(OpKernelConstruction* c) : InsertOp(c, true, false) {}
};
class ImportOp : public InsertOp {
 public:
  explicit ImportOp(OpKernelConstruction* c) : InsertOp(c, false, true) {}
};

class InsertMissingOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& keys = ctx->input(1);
    const Tensor& values = ctx->input(2);
    TFRA_DE_REQUIRES_OK(ctx, CheckKeys(keys));
    TFRA_DE_REQUIRES_OK(ctx, CheckRows("values", values, keys.dim_size(0), t->options().dim));
    Tensor* stored;
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({keys.dim_size(0), t->options().dim}), &stored));
    TFRA_DE_REQUIRES_OK(ctx, t->InsertMissing(keys, values, stored));
  }
};

class RemoveOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& keys = ctx->input(1);
    TFRA_DE_REQUIRES_OK(ctx, CheckKeys(keys));
    int64_t removed = 0;
    TFRA_DE_REQUIRES_OK(ctx, t->Remove(keys, &removed));
    Tensor* out;
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = removed;
  }
};

class SizeOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    int64_t size = 0;
    TFRA_DE_REQUIRES_OK(ctx, t->Size(&size));
    Tensor* out;
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = size;
  }
};

class ClearOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override { TFRA_DE_REQUIRES_OK(ctx, t->Clear()); }
};

class ExportOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override { TFRA_DE_REQUIRES_OK(ctx, t->Export(ctx, 0, 1)); }
};

class DumpOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& dir = ctx->input(1);
    TFRA_DE_REQUIRES(ctx, TensorShapeUtils::IsScalar(dir.shape()),
                absl::InvalidArgumentError("directory must be a string scalar"));
    std::vector<std::string> files;
    TFRA_DE_REQUIRES_OK(ctx, t->Dump(std::string(dir.scalar<tensorflow::tstring>()()), &files));
    Tensor* out;
    TFRA_DE_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({static_cast<int64_t>(files.size())}), &out));
    for (size_t i = 0; i < files.size(); ++i) out->flat<tensorflow::tstring>()(i) = files[i];
  }
};

class RestoreOp : public RedisTableOp {
 public:
  using RedisTableOp::RedisTableOp;
  void Run(OpKernelContext* ctx, RedisTable* t) override {
    const Tensor& files = ctx->input(1);
    TFRA_DE_REQUIRES(ctx, TensorShapeUtils::IsVector(files.shape()),
                absl::InvalidArgumentError("files must be a 1-D string tensor"));
    std::vector<std::string> paths;
    for (int64_t i = 0; i < files.NumElements(); ++i) paths.emplace_back(files.flat<tensorflow::tstring>()(i));
    TFRA_DE_REQUIRES_OK(ctx, t->Restore(paths));
  }
};

REGISTER_KERNEL_BUILDER(Name("TfraDeRedisDump").Device(tensorflow::DEVICE_CPU), DumpOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisRestore").Device(tensorflow::DEVICE_CPU), RestoreOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisTable").Device(tensorflow::DEVICE_CPU), RedisTableHandleOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisFind").Device(tensorflow::DEVICE_CPU), FindOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisInsert").Device(tensorflow::DEVICE_CPU), PlainInsertOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisAccum").Device(tensorflow::DEVICE_CPU), AccumOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisImport").Device(tensorflow::DEVICE_CPU), ImportOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisInsertMissing").Device(tensorflow::DEVICE_CPU), InsertMissingOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisRemove").Device(tensorflow::DEVICE_CPU), RemoveOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisSize").Device(tensorflow::DEVICE_CPU), SizeOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisClear").Device(tensorflow::DEVICE_CPU), ClearOp);
REGISTER_KERNEL_BUILDER(Name("TfraDeRedisExport").Device(tensorflow::DEVICE_CPU), ExportOp);

}  // namespace

}  // namespace redis
}  // namespace tfra_de

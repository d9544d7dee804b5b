// A dynamic-embedding table kept in Redis, in TFRA's layout: slice s of the
// table is the Redis hash hashes[s]; a field is the key's raw bytes (the
// little-endian integer, or the string), its value the row's raw bytes
// (dim little-endian values). Every op is batched (keys_sending_size keys per
// command) and pipelined; nothing is cached here, so several processes (and
// TFRA's own tables) can share the data.
#ifndef TFRA_DE_CC_REDIS_REDIS_TABLE_H_
#define TFRA_DE_CC_REDIS_REDIS_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cc/redis/redis_backend.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace tfra_de {
namespace redis {

using tensorflow::DataType;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;

struct TableOptions {
  DataType key_dtype = tensorflow::DT_INT64;
  DataType value_dtype = tensorflow::DT_FLOAT;
  int64_t dim = 1;
  std::vector<std::string> hashes;  // one per storage slice (TFRA's names)
  bool spread_slices = false;       // cluster mode: keys spread over the slices (TFRA)
  bool hash_slices = false;         // using_hash_storage_slice: CRC32C of the key
  int64_t keys_per_command = 1024;  // keys_sending_size
  int64_t expire_seconds = -1;      // > 0: every write sets this TTL on the hashes it wrote
};

class RedisTable : public tensorflow::ResourceBase {
 public:
  RedisTable(TableOptions opt, std::unique_ptr<Backend> backend);

  std::string DebugString() const override;
  const TableOptions& options() const { return opt_; }
  int64_t row_bytes() const { return row_bytes_; }

  // values[i] = the row of keys[i], or defaults[i] (defaults: [dim] or [N, dim])
  // when absent; exists[i] says which.
  Status Find(const Tensor& keys, const Tensor& defaults, Tensor* values, Tensor* exists);
  // Upsert. Duplicate keys: the last row wins.
  Status Insert(const Tensor& keys, const Tensor& values);
  // Adds deltas to the rows (a missing key is inserted with its delta), in one
  // server-side script per command, so concurrent writers all add up.
  Status Accum(const Tensor& keys, const Tensor& deltas);
  // Inserts the keys that are absent with `values`; stored[i] is the row the
  // table holds for keys[i] afterwards (another writer's, if it came first).
  Status InsertMissing(const Tensor& keys, const Tensor& values, Tensor* stored);
  Status Remove(const Tensor& keys, int64_t* removed);
  Status Size(int64_t* size);
  Status Clear();
  // Every (key, row) of every slice; a key comes once.
  Status Export(OpKernelContext* ctx, int keys_output, int values_output);
  // TFRA's table_store_mode 1: writes each slice's `DUMP` (Redis' serialized
  // hash; an empty file for an absent hash) to `<directory>/<hash name>.rdb`
  // (bytes that are not [A-Za-z0-9._:{}-] as %XX), through a temporary file
  // renamed into place; files[i]: the path of slice i's file.
  Status Dump(const std::string& directory, std::vector<std::string>* files);
  // Reads files[i] (Dump's) into slice i with `RESTORE ... REPLACE` (an empty
  // file removes the hash). Only reads the files.
  Status Restore(const std::vector<std::string>& files);

 private:
  struct Batch;
  // Splits keys into commands `verb hash f1 [v1] f2 [v2] ...` per slice and
  // lane, keys_per_command keys each. `prefix` args come before the hash
  // (EVAL script 1), `after_hash` after it.
  Status BuildBatch(const Tensor& keys, std::vector<std::string> prefix,
                    std::vector<std::string> after_hash, const Tensor* rows, Batch* batch);
  int SliceOf(const char* p, size_t n) const;
  Status RunAll(const std::vector<Command>& cmds, const ReplyFn& on_reply);
  // Appends `EXPIRE hash expire_seconds` after the last command of each
  // (hash, lane) of the batch, when expire_seconds > 0.
  void AddExpire(Batch* batch) const;

  const TableOptions opt_;
  const std::unique_ptr<Backend> backend_;
  const int64_t row_bytes_;
};

}  // namespace redis
}  // namespace tfra_de

#endif  // TFRA_DE_CC_REDIS_REDIS_TABLE_H_

#include "cc/redis/redis_table.h"

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cstring>
#include <deque>
#include <string_view>
#include <thread>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "cc/ops/de_util.h"  // Mix64
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/lib/io/path.h"
#include "tensorflow/core/platform/env.h"

namespace tfra_de {
namespace redis {
namespace {

using tensorflow::TensorShape;

// Lanes: a large batch is split by key over up to this many connections that
// run in parallel (the server is single-threaded; more would only queue).
constexpr int kMaxLanes = 4;
// A lane per this many commands at least: small ops stay on one connection.
constexpr int64_t kCommandsPerLane = 4;
// A lane per 4 CPUs of this machine at most: each lane's replies are read by a
// thread of its own, which on a small machine takes CPU from TF's threads and
// from a Redis server running beside it (measured on 2 CPUs: 2 lanes cost the
// server ~10% more CPU per key than 1).
int64_t CpuLanes() {
  static const int64_t lanes = std::max<int64_t>(1, std::thread::hardware_concurrency() / 4);
  return lanes;
}

// accum: rows += deltas inside the server, so that concurrent writers (several
// workers' bp_v2 updates) all add up without a read-modify-write race. Lua's
// numbers are doubles: a float32 or float64 sum is exact before it is rounded
// to the row's type; 16-bit rows are decoded by hand and rounded first to
// float32 and then to 16 bits, as Eigen's half / bfloat16 `+` does, so every
// result equals the in-memory table's bit for bit.
// ARGV: kind (f, d, h: float16, b: bfloat16), dim, then field, delta pairs.
constexpr char kAccumScript[] = R"lua(
local kind, dim = ARGV[1], tonumber(ARGV[2])
local width = (kind == 'd' and 8) or (kind == 'f' and 4) or 2
local code = (kind == 'd' and 'd') or (kind == 'f' and 'f') or 'H'
local rowbytes = dim * width
local function round_even(q)
  local f = math.floor(q)
  local r = q - f
  if r > 0.5 or (r == 0.5 and f % 2 == 1) then f = f + 1 end
  return f
end
local function decode16(u)
  if kind == 'b' then return (struct.unpack('<f', struct.pack('<I4', u * 65536))) end
  local s = 1
  if u >= 32768 then s = -1; u = u - 32768 end
  local e, m = math.floor(u / 1024), u % 1024
  if e == 0 then return s * m * 2^-24 end
  if e == 31 then if m == 0 then return s * math.huge end return 0/0 end
  return s * (1024 + m) * 2^(e - 25)
end
local function encode16(x)
  local raw = struct.unpack('<I4', struct.pack('<f', x))
  local bits, sign = raw % 2147483648, 0
  if raw >= 2147483648 then sign = 32768 end
  if kind == 'b' then
    if bits > 2139095040 then return sign + 32704 end  -- a NaN: quiet, its sign kept
    return math.floor((raw + 32767 + math.floor(raw / 65536) % 2) / 65536)
  end
  if bits > 2139095040 then return sign + 32256 end
  if bits == 2139095040 then return sign + 31744 end
  local a = (struct.unpack('<f', struct.pack('<I4', bits)))
  if a < 2^-14 then return sign + round_even(a * 2^24) end
  local m, e = math.frexp(a)
  local q = round_even(m * 2048)
  if q == 2048 then q = 1024; e = e + 1 end
  if e + 14 >= 31 then return sign + 31744 end
  return sign + (e + 14) * 1024 + (q - 1024)
end
local function add(cur, delta)
  local parts, pos, done = {}, 1, 0
  while done < dim do
    local k = math.min(256, dim - done)
    local fmt = '<' .. string.rep(code, k)
    local a = {struct.unpack(fmt, cur, pos)}
    local d = {struct.unpack(fmt, delta, pos)}
    for j = 1, k do
      if code == 'H' then
        a[j] = encode16(decode16(a[j]) + decode16(d[j]))
      else
        a[j] = a[j] + d[j]
      end
    end
    parts[#parts + 1] = struct.pack(fmt, unpack(a, 1, k))
    pos = pos + k * width
    done = done + k
  end
  return table.concat(parts)
end
local hash = KEYS[1]
for i = 3, #ARGV, 2 do
  local cur = redis.call('HGET', hash, ARGV[i])
  if cur then
    if #cur ~= rowbytes then
      return redis.error_reply('a row in ' .. hash .. ' has ' .. #cur .. ' bytes, not dim * ' ..
                               width .. ' = ' .. rowbytes .. ' (another table under this name?)')
    end
    redis.call('HSET', hash, ARGV[i], add(cur, ARGV[i + 1]))
  else
    redis.call('HSET', hash, ARGV[i], ARGV[i + 1])
  end
end
return (#ARGV - 2) / 2
)lua";

// insert_missing: HSETNX each (field, row) and answer the row stored, in one
// step per command, so that a concurrent writer's row is never overwritten.
constexpr char kInsertMissingScript[] = R"lua(
local out, hash = {}, KEYS[1]
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', hash, ARGV[i], ARGV[i + 1]) == 1 then
    out[#out + 1] = ARGV[i + 1]
  else
    out[#out + 1] = redis.call('HGET', hash, ARGV[i])
  end
end
return out
)lua";

// TFRA's key hash for using_hash_storage_slice: CRC-32C started at ~0 and not
// inverted at the end (the SSE4.2 instruction's register).
struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
const Crc32cTable kCrc;

uint32_t Crc32cTfra(const char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = (c >> 8) ^ kCrc.t[(c ^ static_cast<uint8_t>(p[i])) & 0xFF];
  return c;
}

uint64_t LaneHash(const char* p, size_t n) {
  uint64_t h = n;
  for (size_t i = 0; i < n; ++i) h = h * 0x100000001b3ULL ^ static_cast<uint8_t>(p[i]);
  return Mix64(h);
}

// The raw bytes of key i: the integer's little-endian bytes, or the string.
struct KeyBytes {
  const char* p;
  size_t n;
};

KeyBytes KeyAt(const Tensor& keys, int64_t i) {
  switch (keys.dtype()) {
    case tensorflow::DT_INT32:
      return {reinterpret_cast<const char*>(keys.flat<int32_t>().data() + i), 4};
    case tensorflow::DT_INT64:
      return {reinterpret_cast<const char*>(keys.flat<int64_t>().data() + i), 8};
    default: {
      const tensorflow::tstring& s = keys.flat<tensorflow::tstring>()(i);
      return {s.data(), s.size()};
    }
  }
}

const char* RowAt(const Tensor& rows, int64_t i, int64_t row_bytes) {
  return rows.tensor_data().data() + i * row_bytes;
}

char* MutableRowAt(Tensor* rows, int64_t i, int64_t row_bytes) {
  return const_cast<char*>(rows->tensor_data().data()) + i * row_bytes;
}

const char* Kind(DataType v) {
  switch (v) {
    case tensorflow::DT_DOUBLE: return "d";
    case tensorflow::DT_HALF: return "h";
    case tensorflow::DT_BFLOAT16: return "b";
    default: return "f";
  }
}

}  // namespace

struct RedisTable::Batch {
  std::vector<Command> cmds;
  std::vector<std::vector<int64_t>> rows;  // rows[c]: key indices of command c, in order
  std::vector<std::string> prefix, after_hash;  // the commands point into these
  size_t data_commands = 0;  // cmds[data_commands..]: EXPIREs (AddExpire)
  std::string ttl;
};

void RedisTable::AddExpire(Batch* b) const {
  b->data_commands = b->cmds.size();
  if (opt_.expire_seconds <= 0) return;
  b->ttl = std::to_string(opt_.expire_seconds);
  // The last command of each (hash, lane): an EXPIRE after it runs after every
  // write of that lane (a lane keeps its order), so no write outlives its TTL.
  std::vector<std::pair<int, std::string>> seen;
  for (size_t c = b->data_commands; c-- > 0;) {
    const Command& cmd = b->cmds[c];
    std::pair<int, std::string> id(cmd.lane, std::string(cmd.argv[cmd.key_arg], cmd.len[cmd.key_arg]));
    if (std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
    seen.push_back(id);
  }
  for (const auto& id : seen) {
    b->cmds.emplace_back();
    Command& cmd = b->cmds.back();
    cmd.lane = id.first;
    cmd.Add("EXPIRE", 6);
    cmd.AddOwned(id.second);
    cmd.Add(b->ttl);
    b->rows.emplace_back();
  }
}

RedisTable::RedisTable(TableOptions opt, std::unique_ptr<Backend> backend)
    : opt_(std::move(opt)),
      backend_(std::move(backend)),
      row_bytes_(opt_.dim * tensorflow::DataTypeSize(opt_.value_dtype)) {}

std::string RedisTable::DebugString() const {
  return absl::StrCat("Redis table on ", backend_->Name(), " (", opt_.hashes.size(), " slice(s), ",
                      tensorflow::DataTypeString(opt_.key_dtype), " -> ",
                      tensorflow::DataTypeString(opt_.value_dtype), "[", opt_.dim, "])");
}

int RedisTable::SliceOf(const char* p, size_t n) const {
  const size_t slices = opt_.hashes.size();
  if (!opt_.spread_slices || slices <= 1) return 0;
  if (opt_.key_dtype == tensorflow::DT_STRING) {
    // TFRA hashes the first len(key) bytes of TensorFlow's string object; for
    // keys of at most 22 bytes (kept inline) that is a byte len << 2 followed
    // by the key without its last byte. Longer keys: their bytes (TFRA's slice
    // is a pointer's hash there, which no one can reproduce).
    if (n <= 22) {
      char buf[22];
      if (n > 0) {
        buf[0] = static_cast<char>(n << 2);
        std::memcpy(buf + 1, p, n - 1);
      }
      return static_cast<int>(Crc32cTfra(buf, n) % slices);
    }
    return static_cast<int>(Crc32cTfra(p, n) % slices);
  }
  if (opt_.hash_slices) return static_cast<int>(Crc32cTfra(p, n) % slices);
  uint32_t low;
  std::memcpy(&low, p, 4);  // little-endian: the key's low 32 bits
  return static_cast<int>(low % slices);
}

Status RedisTable::BuildBatch(const Tensor& keys, std::vector<std::string> prefix_args,
                              std::vector<std::string> after_hash_args, const Tensor* rows,
                              Batch* batch) {
  // Kept in the batch: its commands point into them until they have run.
  batch->prefix = std::move(prefix_args);
  batch->after_hash = std::move(after_hash_args);
  const std::vector<std::string>& prefix = batch->prefix;
  const std::vector<std::string>& after_hash = batch->after_hash;
  const int64_t n = keys.NumElements();
  const int64_t per = std::max<int64_t>(opt_.keys_per_command, 1);
  const int slices = static_cast<int>(opt_.hashes.size());
  const int64_t commands = (n + per - 1) / per;
  const int lanes = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>({commands / kCommandsPerLane, kMaxLanes, backend_->PoolSize(), CpuLanes()})));
  // Group key indices by (slice, lane), keeping their order within a group.
  const int groups = slices * lanes;
  std::vector<int32_t> group(n);
  std::vector<int64_t> count(groups + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const KeyBytes k = KeyAt(keys, i);
    const int lane = lanes > 1 ? static_cast<int>(LaneHash(k.p, k.n) % lanes) : 0;
    group[i] = SliceOf(k.p, k.n) * lanes + lane;
    ++count[group[i] + 1];
  }
  for (int g = 0; g < groups; ++g) count[g + 1] += count[g];
  std::vector<int64_t> order(n);
  {
    std::vector<int64_t> at(count.begin(), count.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[at[group[i]]++] = i;
  }
  for (int g = 0; g < groups; ++g) {
    const std::string& hash = opt_.hashes[g / lanes];
    for (int64_t lo = count[g]; lo < count[g + 1]; lo += per) {
      const int64_t hi = std::min(lo + per, count[g + 1]);
      batch->cmds.emplace_back();
      Command& cmd = batch->cmds.back();
      cmd.lane = g % lanes;
      const size_t argc = prefix.size() + 1 + after_hash.size() + (hi - lo) * (rows ? 2 : 1);
      cmd.argv.reserve(argc);
      cmd.len.reserve(argc);
      for (const auto& a : prefix) cmd.Add(a);
      cmd.key_arg = static_cast<int>(cmd.argv.size());
      cmd.Add(hash);
      for (const auto& a : after_hash) cmd.Add(a);
      batch->rows.emplace_back(order.begin() + lo, order.begin() + hi);
      for (int64_t p = lo; p < hi; ++p) {
        const KeyBytes k = KeyAt(keys, order[p]);
        cmd.Add(k.p, k.n);
        if (rows) cmd.Add(RowAt(*rows, order[p], row_bytes_), row_bytes_);
      }
    }
  }
  return absl::OkStatus();
}

Status RedisTable::RunAll(const std::vector<Command>& cmds, const ReplyFn& on_reply) {
  return backend_->Run(cmds, on_reply);
}

Status RedisTable::Find(const Tensor& keys, const Tensor& defaults, Tensor* values, Tensor* exists) {
  const int64_t n = keys.NumElements();
  const bool one_default = defaults.NumElements() == opt_.dim;
  bool* found = exists->flat<bool>().data();
  for (int64_t i = 0; i < n; ++i) {
    found[i] = false;
    std::memcpy(MutableRowAt(values, i, row_bytes_), RowAt(defaults, one_default ? 0 : i, row_bytes_),
                row_bytes_);
  }
  Batch b;
  TF_RETURN_IF_ERROR(BuildBatch(keys, {"HMGET"}, {}, nullptr, &b));
  // The replies are parsed straight into `values` (RowSink): no object per key.
  std::vector<RowSink> sinks(b.cmds.size());
  for (size_t c = 0; c < b.cmds.size(); ++c) {
    RowSink& s = sinks[c];
    s.idx = b.rows[c].data();
    s.n = b.rows[c].size();
    s.rows = MutableRowAt(values, 0, row_bytes_);
    s.found = found;
    s.row_bytes = row_bytes_;
    b.cmds[c].sink = &s;
  }
  return RunAll(b.cmds, [&](size_t c, const redisReply* r) -> Status {
    const auto& idx = b.rows[c];
    if (r->type != REDIS_REPLY_ARRAY || r->elements != idx.size()) {
      return absl::InternalError(absl::StrCat("Redis ", backend_->Name(), ": HMGET on '",
                                              b.cmds[c].Key(), "' answered reply type ", r->type,
                                              " with ", r->elements, " elements for ", idx.size(),
                                              " keys"));
    }
    auto bad_row = [&](int64_t len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Redis ", backend_->Name(), ": hash '", b.cmds[c].Key(), "' holds a row of ", len,
          " bytes, not dim * sizeof(", tensorflow::DataTypeString(opt_.value_dtype), ") = ",
          row_bytes_, " (another table, or another dim, under this name?)"));
    };
    if (sinks[c].Parsed(r)) return sinks[c].bad_len < 0 ? absl::OkStatus() : bad_row(sinks[c].bad_len);
    for (size_t j = 0; j < idx.size(); ++j) {
      const redisReply* e = r->element[j];
      if (e->type == REDIS_REPLY_NIL) continue;
      if (e->type != REDIS_REPLY_STRING || static_cast<int64_t>(e->len) != row_bytes_) {
        return bad_row(static_cast<int64_t>(e->len));
      }
      std::memcpy(MutableRowAt(values, idx[j], row_bytes_), e->str, row_bytes_);
      found[idx[j]] = true;
    }
    return absl::OkStatus();
  });
}

Status RedisTable::Insert(const Tensor& keys, const Tensor& values) {
  Batch b;
  TF_RETURN_IF_ERROR(BuildBatch(keys, {"HSET"}, {}, &values, &b));
  AddExpire(&b);
  return RunAll(b.cmds, [](size_t, const redisReply*) { return absl::OkStatus(); });
}

Status RedisTable::Accum(const Tensor& keys, const Tensor& deltas) {
  Batch b;
  TF_RETURN_IF_ERROR(BuildBatch(keys, {"EVAL", kAccumScript, "1"},
                                {Kind(opt_.value_dtype), std::to_string(opt_.dim)}, &deltas, &b));
  AddExpire(&b);
  return RunAll(b.cmds, [](size_t, const redisReply*) { return absl::OkStatus(); });
}

Status RedisTable::InsertMissing(const Tensor& keys, const Tensor& values, Tensor* stored) {
  Batch b;
  TF_RETURN_IF_ERROR(BuildBatch(keys, {"EVAL", kInsertMissingScript, "1"}, {}, &values, &b));
  AddExpire(&b);
  return RunAll(b.cmds, [&](size_t c, const redisReply* r) -> Status {
    if (c >= b.data_commands) return absl::OkStatus();  // EXPIRE
    const auto& idx = b.rows[c];
    if (r->type != REDIS_REPLY_ARRAY || r->elements != idx.size()) {
      return absl::InternalError(absl::StrCat("Redis ", backend_->Name(),
                                              ": insert_missing on '", b.cmds[c].Key(),
                                              "' answered ", r->elements, " rows for ", idx.size(),
                                              " keys"));
    }
    for (size_t j = 0; j < idx.size(); ++j) {
      const redisReply* e = r->element[j];
      if (e->type != REDIS_REPLY_STRING || static_cast<int64_t>(e->len) != row_bytes_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Redis ", backend_->Name(), ": hash '", b.cmds[c].Key(), "' holds a row of ", e->len,
            " bytes, not ", row_bytes_, " (another table, or another dim, under this name?)"));
      }
      std::memcpy(MutableRowAt(stored, idx[j], row_bytes_), e->str, row_bytes_);
    }
    return absl::OkStatus();
  });
}

Status RedisTable::Remove(const Tensor& keys, int64_t* removed) {
  Batch b;
  TF_RETURN_IF_ERROR(BuildBatch(keys, {"HDEL"}, {}, nullptr, &b));
  std::atomic<int64_t> total{0};
  Status s = RunAll(b.cmds, [&](size_t, const redisReply* r) {
    if (r->type == REDIS_REPLY_INTEGER) total += r->integer;
    return absl::OkStatus();
  });
  *removed = total.load();
  return s;
}

Status RedisTable::Size(int64_t* size) {
  std::vector<Command> cmds(opt_.hashes.size());
  for (size_t s = 0; s < cmds.size(); ++s) {
    cmds[s].Add("HLEN", 4);
    cmds[s].Add(opt_.hashes[s]);
  }
  std::atomic<int64_t> total{0};
  TF_RETURN_IF_ERROR(RunAll(cmds, [&](size_t, const redisReply* r) {
    if (r->type == REDIS_REPLY_INTEGER) total += r->integer;
    return absl::OkStatus();
  }));
  *size = total.load();
  return absl::OkStatus();
}

Status RedisTable::Clear() {
  // UNLINK frees a big hash in the server's background thread: the server
  // keeps answering other clients meanwhile (DEL would block it).
  std::vector<Command> cmds(opt_.hashes.size());
  for (size_t s = 0; s < cmds.size(); ++s) {
    cmds[s].Add("UNLINK", 6);
    cmds[s].Add(opt_.hashes[s]);
  }
  return RunAll(cmds, [](size_t, const redisReply*) { return absl::OkStatus(); });
}

Status RedisTable::Export(OpKernelContext* ctx, int keys_output, int values_output) {
  // HSCAN walks a hash in steps without blocking the server; a key may come
  // twice when the hash is resized meanwhile, so keys are deduplicated.
  std::deque<std::string> fields;
  std::string rows;
  std::unordered_set<std::string_view> seen;
  const size_t key_size = opt_.key_dtype == tensorflow::DT_STRING
                              ? 0
                              : static_cast<size_t>(tensorflow::DataTypeSize(opt_.key_dtype));
  const std::string count = std::to_string(std::max<int64_t>(opt_.keys_per_command, 10));
  for (const std::string& hash : opt_.hashes) {
    std::string cursor = "0";
    do {
      std::vector<Command> cmds(1);
      Command& cmd = cmds[0];
      cmd.Add("HSCAN", 5);
      cmd.Add(hash);
      cmd.AddOwned(cursor);
      cmd.Add("COUNT", 5);
      cmd.Add(count);
      TF_RETURN_IF_ERROR(RunAll(cmds, [&](size_t, const redisReply* r) -> Status {
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY ||
            r->element[1]->elements % 2 != 0) {
          return absl::InternalError(absl::StrCat("Redis ", backend_->Name(), ": unexpected HSCAN reply on '",
                                                  Printable(hash), "'"));
        }
        cursor.assign(r->element[0]->str, r->element[0]->len);
        const redisReply* items = r->element[1];
        for (size_t j = 0; j < items->elements; j += 2) {
          const redisReply* f = items->element[j];
          const redisReply* v = items->element[j + 1];
          if (key_size != 0 && f->len != key_size) {
            return absl::InvalidArgumentError(absl::StrCat(
                "Redis ", backend_->Name(), ": hash '", Printable(hash), "' holds a field of ", f->len,
                " bytes, not a ", tensorflow::DataTypeString(opt_.key_dtype),
                " key (another table under this name?)"));
          }
          if (static_cast<int64_t>(v->len) != row_bytes_) {
            return absl::InvalidArgumentError(absl::StrCat(
                "Redis ", backend_->Name(), ": hash '", Printable(hash), "' holds a row of ", v->len,
                " bytes, not ", row_bytes_, " (another table, or another dim, under this name?)"));
          }
          fields.emplace_back(f->str, f->len);
          if (!seen.insert(std::string_view(fields.back())).second) {
            fields.pop_back();
            continue;
          }
          rows.append(v->str, v->len);
        }
        return absl::OkStatus();
      }));
    } while (cursor != "0");
  }
  const int64_t n = static_cast<int64_t>(fields.size());
  Tensor* keys_out;
  Tensor* values_out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(keys_output, TensorShape({n}), &keys_out));
  TF_RETURN_IF_ERROR(ctx->allocate_output(values_output, TensorShape({n, opt_.dim}), &values_out));
  for (int64_t i = 0; i < n; ++i) {
    const std::string& f = fields[i];
    switch (opt_.key_dtype) {
      case tensorflow::DT_INT32:
        std::memcpy(keys_out->flat<int32_t>().data() + i, f.data(), 4);
        break;
      case tensorflow::DT_INT64:
        std::memcpy(keys_out->flat<int64_t>().data() + i, f.data(), 8);
        break;
      default:
        keys_out->flat<tensorflow::tstring>()(i) = f;
    }
  }
  if (n > 0) std::memcpy(MutableRowAt(values_out, 0, row_bytes_), rows.data(), rows.size());
  return absl::OkStatus();
}

namespace {

// A hash name as a file name: [A-Za-z0-9._:{}-] as is, other bytes %XX.
std::string FileNameOf(const std::string& hash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : hash) {
    if (std::isalnum(ch) || std::strchr("._:{}-", ch) != nullptr) {
      out.push_back(static_cast<char>(ch));
    } else {
      out.push_back('%');
      out.push_back(kHex[ch >> 4]);
      out.push_back(kHex[ch & 15]);
    }
  }
  return out + ".rdb";
}

}  // namespace

Status RedisTable::Dump(const std::string& directory, std::vector<std::string>* files) {
  tensorflow::Env* env = tensorflow::Env::Default();
  TF_RETURN_IF_ERROR(env->RecursivelyCreateDir(directory));
  std::vector<Command> cmds(opt_.hashes.size());
  for (size_t s = 0; s < cmds.size(); ++s) {
    cmds[s].Add("DUMP", 4);
    cmds[s].Add(opt_.hashes[s]);
  }
  std::vector<std::string> payloads(cmds.size());
  TF_RETURN_IF_ERROR(RunAll(cmds, [&](size_t s, const redisReply* r) -> Status {
    if (r->type == REDIS_REPLY_STRING) {
      payloads[s].assign(r->str, r->len);
    } else if (r->type != REDIS_REPLY_NIL) {
      return absl::InternalError(absl::StrCat("Redis ", backend_->Name(), ": DUMP of '",
                                              Printable(opt_.hashes[s]), "' answered reply type ", r->type));
    }
    return absl::OkStatus();
  }));
  files->clear();
  for (size_t s = 0; s < cmds.size(); ++s) {
    const std::string path = tensorflow::io::JoinPath(directory, FileNameOf(opt_.hashes[s]));
    const std::string tmp = absl::StrCat(path, ".tmp", env->NowMicros());
    TF_RETURN_IF_ERROR(tensorflow::WriteStringToFile(env, tmp, payloads[s]));
    TF_RETURN_IF_ERROR(env->RenameFile(tmp, path));
    files->push_back(path);
  }
  return absl::OkStatus();
}

Status RedisTable::Restore(const std::vector<std::string>& files) {
  if (files.size() != opt_.hashes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Redis dump holds ", files.size(), " slice file(s), the table has ", opt_.hashes.size(),
        " slice(s) (storage_slice): restore it into a table of the same storage_slice"));
  }
  tensorflow::Env* env = tensorflow::Env::Default();
  std::vector<std::string> payloads(files.size());
  for (size_t s = 0; s < files.size(); ++s) {
    Status read = tensorflow::ReadFileToString(env, files[s], &payloads[s]);
    if (!read.ok()) {
      return absl::Status(read.code(), absl::StrCat("cannot read the Redis dump file of slice ", s,
                                                    " (table_store_mode 1): ", read.message()));
    }
  }
  std::vector<Command> cmds(files.size());
  const std::string ttl = std::to_string(opt_.expire_seconds > 0 ? opt_.expire_seconds * 1000 : 0);
  for (size_t s = 0; s < files.size(); ++s) {
    if (payloads[s].empty()) {
      cmds[s].Add("UNLINK", 6);
      cmds[s].Add(opt_.hashes[s]);
      continue;
    }
    cmds[s].Add("RESTORE", 7);
    cmds[s].Add(opt_.hashes[s]);
    cmds[s].Add(ttl);  // ms; 0: no TTL
    cmds[s].Add(payloads[s]);
    cmds[s].Add("REPLACE", 7);
  }
  return RunAll(cmds, [](size_t, const redisReply*) { return absl::OkStatus(); });
}

}  // namespace redis
}  // namespace tfra_de

// Export, import and files of a Table<K, V>: whole-table and chunked exports
// into tensors (Export; chunked exports are registered so that no shard
// compacts under their cursors, de_compaction.h), imports that add to or
// replace the content (Import), and per-shard streaming files in the format of
// de_file.h (SaveToFile / LoadFromFile). Everything that moves a table's rows
// in or out as a whole is here, so the cursor format and the consistency rules
// (a shard read under its lock, a replacement under every lock) are in one place.
// A slot group's exports and files hold the keys it was written for
// (de_table.h), and importing a group marks it written for the imported keys.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_IO_H_
#define TFRA_DE_CC_OPS_DE_TABLE_IO_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_batch.h"
#include "de_compaction.h"
#include "de_file.h"
#include "de_groups.h"
#include "de_table_core.h"
#include "tensorflow/core/framework/types.h"

namespace tfra_de {

// Chunked export cursors: bits 0-31 a row, 32-47 a shard; a scan that began
// at cursor 0 is registered (kScanCursor), its cursors also carry the shard's
// compaction count (bits 48-61, kCompactionMask).
constexpr int64_t kScanCursor = int64_t{1} << 62;
constexpr uint32_t kCompactionMask = (1u << 14) - 1;

inline uint32_t ClampU32(int64_t v) {
  return v < 0 ? 0 : (v > static_cast<int64_t>(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(v));
}

inline std::string TypeName(uint32_t t) {
  return tensorflow::DataType_IsValid(static_cast<int>(t))
             ? tensorflow::DataTypeString(static_cast<DataType>(t))
             : absl::StrCat("dtype#", t);
}

template <class K, class V>
inline Status Table<K, V>::Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next,
                                  int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  if (limit < 0) return ExportAll(sink, next, group);
  const bool registered = cursor >= 0 && (cursor & kScanCursor) != 0;
  const int64_t shard0 = (cursor >> 32) & 0xFFFF;
  if (cursor < 0 || shard0 >= num_shards_ || (!registered && (cursor >> 48) != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("export: cursor ", cursor,
                                                   " is not a cursor returned by this table"));
  }
  // A scan from cursor 0 is registered until its last chunk: while one is
  // open, no shard compacts (rows moving behind its cursor would be missed).
  const bool scan = registered || (cursor == 0 && limit > 0);
  if (cursor == 0 && scan) scans_.Open();
  if (scan) scans_.Touch();
  Status st = ExportChunk(cursor, limit, registered, scan, sink, next, group);
  if (scan && (!st.ok() || *next < 0)) scans_.Close();
  return st;
}

template <class K, class V>
inline Status Table<K, V>::ExportChunk(int64_t cursor, int64_t limit, bool registered, bool scan,
                                       ExportSink* sink, int64_t* next, int group) {
  const int64_t shard0 = (cursor >> 32) & 0xFFFF;
  // A chunk may span shards; each is read under its own lock into staging
  // buffers, so no lock is held while output tensors are allocated.
  std::vector<typename KO::Owned> keys;
  std::vector<V> vals;
  std::vector<int64_t> stamps, freqs;
  const int64_t want = std::min<int64_t>(limit, 1 << 26);
  const bool with_values = sink->WantsValues();
  // Reserved once: growing by doubling would hold up to three chunks' bytes at a time.
  const size_t expect = static_cast<size_t>(std::min<int64_t>(want, Size()));
  keys.reserve(expect);
  if (with_values) vals.reserve(expect * cfg_.dim);
  stamps.reserve(expect);
  freqs.reserve(expect);
  *next = -1;
  uint32_t row = static_cast<uint32_t>(cursor & 0xffffffff);
  for (int64_t si = shard0; si < num_shards_ && *next < 0; ++si, row = 0) {
    const Shard& s = shards_[si];
    std::shared_lock<std::shared_mutex> l(s.mu);
    if (registered && si == shard0 && row > 0 &&
        static_cast<uint32_t>(cursor >> 48 & kCompactionMask) != (s.compactions & kCompactionMask)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export: rows of shard ", si, " moved since this chunked export's previous chunk "
          "(an export with no chunk for ", ScanRegistry::kLeaseNs / 1000000000,
          " s counts as abandoned); export again from cursor 0"));
    }
    for (; row < s.rows.high_water(); ++row) {
      if (static_cast<int64_t>(keys.size()) == want) {
        *next = (si << 32) | row;
        if (scan) *next |= kScanCursor | int64_t{s.compactions & kCompactionMask} << 48;
        break;
      }
      const char* rec = Rec(s, row);
      const uint32_t f = Freq(rec);
      if (f == 0 || (group > 0 && !IsWritten(rec, group))) continue;
      keys.push_back(KO::ToOwned(*reinterpret_cast<const KS*>(rec)));
      if (with_values) {
        const V* v = reinterpret_cast<const V*>(rec + GroupOff(group));
        vals.insert(vals.end(), v, v + cfg_.dim);
      }
      stamps.push_back(Stamp(rec));
      freqs.push_back(f);
    }
  }
  const int64_t n = keys.size();
  Tensor *tk, *tv, *ts, *tf;
  TF_RETURN_IF_ERROR(sink->Allocate(n, &tk, &tv, &ts, &tf));
  auto ok = tk->flat<KIn>();
  for (int64_t i = 0; i < n; ++i) KO::ExportOwned(keys[i], &ok(i));
  if (n > 0) {
    if (with_values) std::memcpy(tv->flat<V>().data(), vals.data(), vals.size() * sizeof(V));
    std::memcpy(ts->flat<int64_t>().data(), stamps.data(), n * 8);
    std::memcpy(tf->flat<int64_t>().data(), freqs.data(), n * 8);
  }
  return absl::OkStatus();
}

// The whole table as one consistent snapshot: every shard locked shared.
template <class K, class V>
inline Status Table<K, V>::ExportAll(ExportSink* sink, int64_t* next, int group) {
  std::vector<std::shared_lock<std::shared_mutex>> locks;
  locks.reserve(num_shards_);
  for (int i = 0; i < num_shards_; ++i) locks.emplace_back(shards_[i].mu);
  const int64_t n = group == 0 ? ShardSum() : GroupSize(group);  // the rows the loop below reads
  Tensor *tk, *tv, *ts, *tf;
  TF_RETURN_IF_ERROR(sink->Allocate(n, &tk, &tv, &ts, &tf));
  auto ok = tk->flat<KIn>();
  V* ov = sink->WantsValues() ? tv->flat<V>().data() : nullptr;
  int64_t* os = ts->flat<int64_t>().data();
  int64_t* of = tf->flat<int64_t>().data();
  int64_t i = 0;
  for (int si = 0; si < num_shards_; ++si) {
    const Shard& s = shards_[si];
    for (uint32_t row = 0; row < s.rows.high_water() && i < n; ++row) {
      const char* rec = Rec(s, row);
      const uint32_t f = Freq(rec);
      if (f == 0 || (group > 0 && !IsWritten(rec, group))) continue;
      KO::Export(*reinterpret_cast<const KS*>(rec), &ok(i));
      if (ov != nullptr) std::memcpy(ov + i * cfg_.dim, rec + GroupOff(group), layout_.row_bytes);
      os[i] = Stamp(rec);
      of[i] = f;
      ++i;
    }
  }
  *next = -1;
  return absl::OkStatus();
}

template <class K, class V>
inline Status Table<K, V>::Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                                  const Tensor& stamps, const Tensor& freqs, bool clear_first,
                                  int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  Batch b;
  TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
  const V* in = values.flat<V>().data();
  const int64_t* st = stamps.NumElements() > 0 ? stamps.flat<int64_t>().data() : nullptr;
  const int64_t* fq = freqs.NumElements() > 0 ? freqs.flat<int64_t>().data() : nullptr;
  const uint32_t now = CurrentStamp();
  const int64_t dim = cfg_.dim;
  // When filled in: per shard, the rows this import wrote.
  std::vector<std::vector<uint8_t>> seen;
  auto body = [&](Shard& s, int64_t lo, int64_t hi) {
    std::vector<uint8_t>* mark = seen.empty() ? nullptr : &seen[Index(s)];
    s.barren_stamp = 0;  // rows of any stamp may come in
    return ForEachRow(s, b, lo, hi, [&](int64_t i, uint64_t h, int64_t row) -> Status {
      const uint32_t stamp = st ? ClampU32(st[i]) : now;
      const uint32_t freq = fq ? std::max<uint32_t>(1, ClampU32(fq[i])) : 1;
      const bool fresh = row < 0;
      if (fresh) {
        uint32_t r;
        TF_RETURN_IF_ERROR(InsertNew(s, b.keys[i], h, &r, group));
        row = r;
      }
      std::memcpy(GVals(s, row, group), in + i * dim, layout_.row_bytes);
      // A slot group's import leaves the metadata of the table's keys alone.
      if (group == 0 || fresh) SetMeta(s, row, stamp, freq);
      MarkWritten(s, row, 1u << group);
      if (mark != nullptr) {
        if (mark->size() <= static_cast<size_t>(row)) mark->resize(s.rows.high_water(), 0);
        (*mark)[row] = 1;
      }
      return absl::OkStatus();
    });
  };
  if (!clear_first) return ForEachShard(ctx, b, Lock::kExclusive, body);
  // Replace: every shard stays locked from clearing to refilling, so no
  // reader sees a half-imported table.
  auto locks = LockAll();
  if (group > 0) {  // the group's columns (and written marks) are reset, then written; no key goes
    for (int i = 0; i < num_shards_; ++i) FillGroup(shards_[i], group);
    return ForEachShard(ctx, b, Lock::kNone, body);
  }
  if (groups_.load() == 1) {
    for (int i = 0; i < num_shards_; ++i) FreeShard(&shards_[i]);
    return ForEachShard(ctx, b, Lock::kNone, body);
  }
  // The set of keys is replaced; the slot groups of the keys that stay are
  // kept, with their written marks (a checkpoint restores them before or after
  // the rows).
  seen.resize(num_shards_);
  TF_RETURN_IF_ERROR(ForEachShard(ctx, b, Lock::kNone, body));
  for (int si = 0; si < num_shards_; ++si) {
    Shard& s = shards_[si];
    for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
      if (row < seen[si].size() && seen[si][row]) continue;
      const char* rec = Rec(s, row);
      if (Freq(rec) == 0) continue;
      const KS& k = *reinterpret_cast<const KS*>(rec);
      const int64_t slot = FindSlotStored(s, k, KO::HashStored(k));
      if (slot >= 0) EraseSlot(s, slot);
    }
  }
  return absl::OkStatus();
}

// Inserts one row into a staging table (file loading); single-threaded.
template <class K, class V>
inline Status Table<K, V>::PutOne(const KIn& key, const V* vals, uint32_t stamp, uint32_t freq) {
  const uint64_t h = KO::Hash(key);
  Shard& s = shards_[ShardOf(h)];
  int64_t row = FindRow(s, key, h);
  if (row < 0) {
    uint32_t r;
    TF_RETURN_IF_ERROR(InsertNew(s, key, h, &r));
    row = r;
  }
  WriteRow(s, row, vals, stamp, freq);
  return absl::OkStatus();
}

template <class K, class V>
Status Table<K, V>::SaveToFile(const std::string& path, int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  TableFileWriter w;
  FileHeader h;
  h.key_dtype = cfg_.key_dtype;
  h.value_dtype = cfg_.value_dtype;
  h.dim = static_cast<uint64_t>(cfg_.dim);
  TF_RETURN_IF_ERROR(w.Open(path, h));
  uint64_t total = 0;
  std::vector<std::pair<uint32_t, std::string>> blocks;
  for (int si = 0; si < num_shards_; ++si) {
    // Each shard is a consistent snapshot: it is serialised under its read
    // lock (writers to other shards continue), then written unlocked.
    blocks.clear();
    {
      const Shard& s = shards_[si];
      std::shared_lock<std::shared_mutex> l(s.mu);
      std::string buf;
      uint32_t rows = 0;
      for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
        const char* rec = Rec(s, row);
        if (Freq(rec) == 0 || (group > 0 && !IsWritten(rec, group))) continue;
        KO::Encode(*reinterpret_cast<const KS*>(rec), &buf);
        buf.append(rec + layout_.stamp_off, 8);  // stamp + freq
        buf.append(rec + GroupOff(group), layout_.row_bytes);
        if (++rows == UINT32_MAX || buf.size() >= kBlockTargetBytes) {
          blocks.emplace_back(rows, std::move(buf));
          buf.clear();
          rows = 0;
        }
      }
      if (rows > 0) blocks.emplace_back(rows, std::move(buf));
    }
    for (const auto& blk : blocks) {
      TF_RETURN_IF_ERROR(w.WriteBlock(blk.first, blk.second));
      total += blk.first;
    }
  }
  return w.Finish(total);
}

template <class K, class V>
Status Table<K, V>::LoadFromFile(const std::string& path, int group, int64_t* loaded) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  TableFileReader r;
  FileHeader h;
  TF_RETURN_IF_ERROR(r.Open(path, &h));
  if (h.key_dtype != static_cast<uint32_t>(cfg_.key_dtype) ||
      h.value_dtype != static_cast<uint32_t>(cfg_.value_dtype) ||
      h.dim != static_cast<uint64_t>(cfg_.dim)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_from_file: '", path, "' holds ", TypeName(h.key_dtype), " keys -> ",
        TypeName(h.value_dtype), "[", h.dim, "] rows, but the table is ",
        tensorflow::DataTypeString(cfg_.key_dtype), " -> ",
        tensorflow::DataTypeString(cfg_.value_dtype), "[", cfg_.dim, "]"));
  }
  // Everything is staged in a fresh table and swapped in only after the
  // footer's row count checks out: a bad file never leaves a partial load.
  tensorflow::core::RefCountPtr<Table> staged(new Table(cfg_));  // freed by Unref
  TF_RETURN_IF_ERROR(staged->Init());
  std::string payload;
  uint64_t count = 0, total = 0;
  std::vector<V> row(cfg_.dim);
  for (;;) {
    uint32_t rows = 0;
    bool at_end = false;
    TF_RETURN_IF_ERROR(r.NextBlock(&rows, &payload, &at_end, &total));
    if (at_end) break;
    const char* p = payload.data();
    const char* end = p + payload.size();
    for (uint32_t j = 0; j < rows; ++j) {
      KIn key;
      if (!KO::Decode(&p, end, &key) || static_cast<size_t>(end - p) < 8 + layout_.row_bytes) {
        return absl::DataLossError(absl::StrCat("load_from_file: block in '", path,
                                                "' ends inside row ", j, " of ", rows));
      }
      uint32_t meta[2];
      std::memcpy(meta, p, 8);
      std::memcpy(row.data(), p + 8, layout_.row_bytes);
      p += 8 + layout_.row_bytes;
      TF_RETURN_IF_ERROR(staged->PutOne(key, row.data(), meta[0], std::max<uint32_t>(1, meta[1])));
    }
    if (p != end) {
      return absl::DataLossError(absl::StrCat("load_from_file: block in '", path, "' has ",
                                              end - p, " bytes after its ", rows, " rows"));
    }
    count += rows;
  }
  if (count != total) {
    return absl::DataLossError(absl::StrCat("load_from_file: '", path, "' footer says ", total,
                                            " rows but its blocks hold ", count));
  }
  {
    auto locks = LockAll();
    if (group == 0 && groups_.load() == 1) {
      for (int i = 0; i < num_shards_; ++i) SwapShard(&shards_[i], &staged->shards_[i]);
      *loaded = ShardSum();
      // The shards changed tables, so the counts follow them (`staged` is freed below).
      total_.store(*loaded, std::memory_order_relaxed);
      live_.store(*loaded, std::memory_order_relaxed);
      return absl::OkStatus();  // `staged` now holds the old content and frees it here
    }
  }
  // Records with slot groups: the rows (or one slot group) are imported, which
  // keeps the other groups of the keys that stay (see Import).
  HostSink sink(cfg_, 1);
  int64_t next = -1;
  TF_RETURN_IF_ERROR(staged->ExportAll(&sink, &next, 0));
  staged.reset();
  TF_RETURN_IF_ERROR(Import(nullptr, sink.keys, sink.values, sink.stamps, sink.freqs,
                            /*clear_first=*/true, group));
  *loaded = sink.keys.NumElements();
  return absl::OkStatus();
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_IO_H_

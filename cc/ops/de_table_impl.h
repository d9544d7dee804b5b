// Table<K, V>: the concurrent, compact hash table behind every native op.
//
// Layout. Keys hash to one of S shards (top hash bits); each shard owns
//  - an index: open addressing over 8-slot groups, each slot a uint32 of a
//    7-bit hash tag and a 25-bit row id (0xFFFFFFFF: empty; 0xFFFFFFFE:
//    deleted); a key's first group is its hash scaled to the group count (any
//    multiple of 8 slots), probing goes on group by group;
//  - a slab: one contiguous array of fixed-size records
//      [key | u32 stamp | u32 freq | dim values | dim values per slot group]
//    grown with mremap (no copy, no resident doubling); freed rows are reused
//    through a free list, and freq == 0 marks a free row. After removals a
//    shard may compact: its top rows move into free ones and the pages above
//    go back to the OS (MaybeCompact).
// Growth is per shard, so at most one shard's index exists twice at a time.
//
// Concurrency. A shard's reader-writer lock guards both its index and slab.
// Batch ops hash all keys, bucket them by shard (stable counting sort, so the
// last duplicate wins as in a serial replay), and hand whole shards to TF's
// intra-op pool: each shard is locked once per batch, by one thread. Ops that
// need every shard lock them in index order, so they cannot deadlock.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_
#define TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_file.h"
#include "de_keyed.h"
#include "de_keys.h"
#include "de_draw.h"
#include "de_table.h"
#include "de_util.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfra_de {

inline size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

template <class V>
inline V FromDouble(double x) {
  if constexpr (std::is_same<V, double>::value) {
    return x;
  } else {
    return static_cast<V>(static_cast<float>(x));
  }
}

template <class K, class V>
class Table : public TableBase {
  using KO = KeyOps<K>;
  using KIn = typename KO::In;
  using KS = typename KO::Stored;

  struct alignas(64) Shard {
    mutable std::shared_mutex mu;
    uint32_t* slots = nullptr;   // the index: cap slots (see SlotGroup)
    size_t cap = 0;              // slots; a multiple of kGroupWidth
    size_t growth_left = 0;      // empty slots that may still be filled
    std::atomic<int64_t> size{0};
    char* slab = nullptr;
    size_t slab_rows = 0;        // allocated rows
    uint32_t high_water = 0;     // rows ever handed out
    size_t faulted_rows = 0;     // rows [0, faulted_rows) have their pages faulted in
    size_t fault_ahead = 0;      // new rows this batch may still fault in (PrepareNewRows)
    std::vector<uint32_t> free_rows;
    uint32_t barren_stamp = 0;   // a bound found no row to evict here at this stamp (+1);
                                 // cleared by a write at another stamp (NoteWriteStamp)
    uint32_t compactions = 0;    // times rows moved (Compact): chunked export cursors carry it
  };

  // A batch of keys bucketed by shard.
  struct Batch {
    const KIn* keys = nullptr;
    int64_t n = 0;
    std::vector<uint64_t> hash;
    std::vector<int64_t> order;
    std::vector<int64_t> start;  // S + 1 offsets into order
  };

  enum class Lock { kShared, kExclusive, kNone };

  // Batches at least this large are partitioned by several threads.
  static constexpr int64_t kParallelPartitionKeys = 16384;
  // Read-only batches at least this large visit their keys in batch order
  // (ForEachKeyInOrder), in chunks of 512 to 4096 keys.
  static constexpr int64_t kInOrderMinKeys = 16384;
  // AllocRow faults new rows' pages in ahead in chunks this large: one call per
  // chunk, and at most a chunk per shard faulted but never used.
  static constexpr size_t kFaultChunkBytes = 16384;
  // Chunked export cursors: bits 0-31 a row, 32-47 a shard; a scan that began
  // at cursor 0 is registered (kScanCursor), its cursors also carry the
  // shard's compaction count (bits 48-61, kCompactionMask).
  static constexpr int64_t kScanCursor = int64_t{1} << 62;
  static constexpr uint32_t kCompactionMask = (1u << 14) - 1;
  // A registered scan with no chunk read for this long counts as abandoned.
  static constexpr int64_t kScanLeaseNs = int64_t{300} * 1000 * 1000 * 1000;

 public:
  explicit Table(const TableConfig& cfg) : TableBase(cfg) {
    int s = cfg.num_shards;
    if (s <= 0) s = 64;  // enough stripes for any pool size; empty shards cost ~100 bytes
    shard_bits_ = 0;
    while ((1 << shard_bits_) < s) ++shard_bits_;
    num_shards_ = 1 << shard_bits_;
    shards_.reset(new Shard[num_shards_]);
    const size_t key_bytes = sizeof(KS);
    stamp_off_ = AlignUp(key_bytes, 4);
    freq_off_ = stamp_off_ + 4;
    val_off_ = AlignUp(freq_off_ + 4, alignof(V));
    row_bytes_ = static_cast<size_t>(cfg.dim) * sizeof(V);
    rec_bytes_ = AlignUp(val_off_ + row_bytes_, std::max<size_t>({alignof(KS), alignof(V), 4}));
    init_rows_ = static_cast<size_t>(cfg.init_size / num_shards_);
    prefetch_bytes_ = std::min<size_t>(rec_bytes_, 512);
  }

  ~Table() override {
    for (int i = 0; i < num_shards_; ++i) FreeShard(&shards_[i]);
  }

  void SetBound(int64_t max_rows, int64_t extra_rows, bool lfu) override {
    if (max_rows > 0 && !Bounded()) {
      // The count starts here: taken with every shard locked, so no write is half-counted.
      auto locks = LockAll();
      total_.store(ShardSum(), std::memory_order_relaxed);
      live_.store(ShardSum(), std::memory_order_relaxed);
      recounts_.fetch_add(1, std::memory_order_relaxed);
      TableBase::SetBound(max_rows, extra_rows, lfu);
      return;
    }
    TableBase::SetBound(max_rows, extra_rows, lfu);
  }

  // Allocates every shard's initial index; separate from the constructor so
  // that an allocation failure is a Status, not an exception.
  Status Init() {
    for (int i = 0; i < num_shards_; ++i) TF_RETURN_IF_ERROR(ResetShard(&shards_[i], init_rows_));
    return absl::OkStatus();
  }

  std::string DebugString() const override {
    return absl::StrCat("tfra_de table ", tensorflow::DataTypeString(cfg_.key_dtype), "->",
                        tensorflow::DataTypeString(cfg_.value_dtype), "[", cfg_.dim, "], ",
                        Size(), " keys in ", num_shards_, " shards");
  }

  int64_t MemoryUsed() const override {
    int64_t total = 0;
    for (int i = 0; i < num_shards_; ++i) {
      const Shard& s = shards_[i];
      std::shared_lock<std::shared_mutex> l(s.mu);
      total += s.cap * 4 + s.high_water * rec_bytes_ + s.free_rows.capacity() * 4;
    }
    return total;
  }

  // ----------------------------------------------------------- batch ops --

  Status Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults, Tensor* values,
              Tensor* exists, int group) override {
    TF_RETURN_IF_ERROR(CheckGroup(group));
    const bool per_key = defaults.dims() == 2;
    const V* dflt = defaults.flat<V>().data();
    V* out = values->flat<V>().data();
    bool* ex = exists->flat<bool>().data();
    const int64_t dim = cfg_.dim;
    auto visit = [&](const Shard& s, int64_t i, uint64_t, int64_t row) {
      ex[i] = row >= 0;
      const V* src = row >= 0 ? GVals(s, row, group) : (per_key ? dflt + i * dim : dflt);
      std::memcpy(out + i * dim, src, row_bytes_);
      return absl::OkStatus();
    };
    if (keys.NumElements() >= kInOrderMinKeys) return ForEachKeyInOrder(ctx, keys, visit);
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    return ForEachShard(ctx, b, Lock::kShared, [&](Shard& s, int64_t lo, int64_t hi) {
      auto pre = [&](int64_t i) { PrefetchRow(out + i * dim, /*write=*/true); };
      return ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) {
        return visit(s, i, h, row);
      });
    });
  }

  Status Contains(OpKernelContext* ctx, const Tensor& keys, Tensor* exists) override {
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    bool* ex = exists->flat<bool>().data();
    return ForEachShard(ctx, b, Lock::kShared, [&](Shard& s, int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        if (p + 16 < hi && s.cap != 0) {  // the index group of a key further ahead
          __builtin_prefetch(s.slots + HomeGroup(b.hash[p + 16], s.cap) * kGroupWidth);
        }
        ex[b.order[p]] = FindSlot(s, b.keys[b.order[p]], b.hash[p]) >= 0;
      }
      return absl::OkStatus();
    });
  }

  Status FindInit(OpKernelContext* ctx, const Tensor& keys, const InitSpec& init, bool insert,
                  Tensor* values, Tensor* exists) override {
    V* out = values->flat<V>().data();
    bool* ex = exists->flat<bool>().data();
    const int64_t dim = cfg_.dim;
    const KIn* key_data = keys.flat<KIn>().data();
    if (!insert && keys.NumElements() >= kInOrderMinKeys) {
      TF_RETURN_IF_ERROR(ForEachKeyInOrder(ctx, keys, [&](const Shard& s, int64_t i, uint64_t, int64_t row) {
        ex[i] = row >= 0;
        if (row >= 0) std::memcpy(out + i * dim, Vals(s, row), row_bytes_);
        return absl::OkStatus();
      }));
      // The missing keys' rows are drawn in a pass of their own: interleaved with
      // the probes, the draws were slower than probes and draws one after the other.
      ForEachChunk(ctx, keys.NumElements(), 8 * dim, [&](int64_t lo, int64_t hi) {
        InitRows rows(*this, init);
        for (int64_t i = lo; i < hi; ++i) {
          if (!ex[i]) rows.Add(InitHash(init, key_data[i], KO::Hash(key_data[i])), out + i * dim);
        }
      });
      return absl::OkStatus();
    }
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const uint32_t stamp = CurrentStamp();
    return ForEachShard(ctx, b, insert ? Lock::kExclusive : Lock::kShared,
                        [&](Shard& s, int64_t lo, int64_t hi) -> Status {
      // Pass 1 reads, so `exists` reports the table as it was before this op,
      // also for a key repeated in the batch. Pass 2 creates the missing rows.
      std::vector<int64_t> missing;
      if (insert) NoteWriteStamp(s, stamp);
      InitRows rows(*this, init);
      auto pre = [&](int64_t i) { PrefetchRow(out + i * dim, /*write=*/true); };
      TF_RETURN_IF_ERROR(ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) {
        ex[i] = row >= 0;
        if (row >= 0) {
          std::memcpy(out + i * dim, Vals(s, row), row_bytes_);
        } else if (insert) {
          missing.push_back(i);
          missing.push_back(static_cast<int64_t>(h));
        } else {
          rows.Add(InitHash(init, b.keys[i], h), out + i * dim);
        }
        return absl::OkStatus();
      }));
      rows.Flush();
      if (insert) PrepareNewRows(s, missing.size() / 2);
      for (size_t j = 0; j < missing.size(); j += 2) {
        const int64_t i = missing[j];
        const uint64_t h = static_cast<uint64_t>(missing[j + 1]);
        V* dst = out + i * dim;
        const int64_t row = FindRow(s, b.keys[i], h);
        if (row >= 0) {  // an earlier duplicate in this batch created it
          std::memcpy(dst, Vals(s, row), row_bytes_);
          continue;
        }
        FillInit(init, InitHash(init, b.keys[i], h), dst);
        uint32_t r;
        TF_RETURN_IF_ERROR(InsertNew(s, b.keys[i], h, &r));
        WriteRow(s, r, dst, stamp, 1);
      }
      return absl::OkStatus();
    });
  }

  Status InsertMissing(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                       Tensor* stored) override {
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const V* in = values.flat<V>().data();
    V* out = stored->flat<V>().data();
    const int64_t dim = cfg_.dim;
    const uint32_t stamp = CurrentStamp();
    return ForEachShard(ctx, b, Lock::kExclusive, [&](Shard& s, int64_t lo, int64_t hi) {
      PrepareNewRows(s, static_cast<size_t>(hi - lo));
      NoteWriteStamp(s, stamp);
      return ForEachRow(s, b, lo, hi, [&](int64_t i, uint64_t h, int64_t row) -> Status {
        if (row < 0) {
          uint32_t r;
          TF_RETURN_IF_ERROR(InsertNew(s, b.keys[i], h, &r));
          WriteRow(s, r, in + i * dim, stamp, 1);
          row = r;
        }
        std::memcpy(out + i * dim, Vals(s, row), row_bytes_);
        return absl::OkStatus();
      });
    });
  }

  Status Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                int group) override {
    return Upsert(ctx, keys, values, /*accum=*/false, group);
  }

  Status Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas,
               int group) override {
    return Upsert(ctx, keys, deltas, /*accum=*/true, group);
  }

  Status Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) override {
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    std::atomic<int64_t> count{0};
    Status st = ForEachShard(ctx, b, Lock::kExclusive, [&](Shard& s, int64_t lo, int64_t hi) {
      int64_t c = 0;
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t slot = FindSlot(s, b.keys[b.order[p]], b.hash[p]);
        if (slot >= 0) {
          EraseSlot(s, slot);
          ++c;
        }
      }
      count += c;
      if (c > 0) MaybeCompact(s);
      return absl::OkStatus();
    });
    *removed = count.load();
    return st;
  }

  void Clear(int group) override {
    auto locks = LockAll();
    if (group <= 0 || group >= groups_.load()) {
      if (group == 0) for (int i = 0; i < num_shards_; ++i) FreeShard(&shards_[i]);
      return;
    }
    for (int i = 0; i < num_shards_; ++i) FillGroup(shards_[i], group);
  }

  // A bounded table's size is one counter: a sum of the shards' sizes read while writers move
  // keys (evict in one shard, then add in another) could count a key twice and pass the bound.
  int64_t Size() const override {
    return Bounded() ? live_.load(std::memory_order_relaxed) : ShardSum();
  }

  // ------------------------------------------------------- export/import --

  MemoryUse Memory() const override {
    MemoryUse use;
    for (int i = 0; i < num_shards_; ++i) {
      const Shard& s = shards_[i];
      std::shared_lock<std::shared_mutex> l(s.mu);
      const size_t rows = std::max<size_t>(s.faulted_rows, s.high_water);
      use.rows += static_cast<int64_t>(rows);
      use.records += static_cast<int64_t>(rows * rec_bytes_);
      use.index += static_cast<int64_t>(s.cap * 4);
      use.other += static_cast<int64_t>(s.free_rows.capacity() * 4);
      if constexpr (std::is_same<K, tensorflow::tstring>::value) {  // long keys live on the heap
        for (uint32_t row = 0; row < s.high_water; ++row) {
          const char* rec = s.slab + size_t{row} * rec_bytes_;
          if (Freq(rec) != 0) use.other += KO::HeapBytes(*reinterpret_cast<const KS*>(rec));
        }
      }
    }
    return use;
  }

  Status Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next,
                int group) override {
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
    if (cursor == 0 && scan) scans_open_.fetch_add(1);
    if (scan) scan_seen_ns_.store(NowNs());
    Status st = ExportChunk(cursor, limit, registered, scan, sink, next, group);
    if (scan && (!st.ok() || *next < 0)) CloseScan();
    return st;
  }

  Status ExportChunk(int64_t cursor, int64_t limit, bool registered, bool scan, ExportSink* sink,
                     int64_t* next, int group) {
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
            "(an export with no chunk for ", kScanLeaseNs / 1000000000,
            " s counts as abandoned); export again from cursor 0"));
      }
      for (; row < s.high_water; ++row) {
        if (static_cast<int64_t>(keys.size()) == want) {
          *next = (si << 32) | row;
          if (scan) *next |= kScanCursor | int64_t{s.compactions & kCompactionMask} << 48;
          break;
        }
        const char* rec = s.slab + size_t{row} * rec_bytes_;
        const uint32_t f = Freq(rec);
        if (f == 0) continue;
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

  Status Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                const Tensor& stamps, const Tensor& freqs, bool clear_first,
                int group) override {
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
        std::memcpy(GVals(s, row, group), in + i * dim, row_bytes_);
        // A slot group's import leaves the metadata of the table's keys alone.
        if (group == 0 || fresh) SetMeta(s, row, stamp, freq);
        if (mark != nullptr) {
          if (mark->size() <= static_cast<size_t>(row)) mark->resize(s.high_water, 0);
          (*mark)[row] = 1;
        }
        return absl::OkStatus();
      });
    };
    if (!clear_first) return ForEachShard(ctx, b, Lock::kExclusive, body);
    // Replace: every shard stays locked from clearing to refilling, so no
    // reader sees a half-imported table.
    auto locks = LockAll();
    if (group > 0) {  // the group's columns are reset, then written; no key goes
      for (int i = 0; i < num_shards_; ++i) FillGroup(shards_[i], group);
      return ForEachShard(ctx, b, Lock::kNone, body);
    }
    if (groups_.load() == 1) {
      for (int i = 0; i < num_shards_; ++i) FreeShard(&shards_[i]);
      return ForEachShard(ctx, b, Lock::kNone, body);
    }
    // The set of keys is replaced; the slot groups of the keys that stay are
    // kept (a checkpoint restores them before or after the rows).
    seen.resize(num_shards_);
    TF_RETURN_IF_ERROR(ForEachShard(ctx, b, Lock::kNone, body));
    for (int si = 0; si < num_shards_; ++si) {
      Shard& s = shards_[si];
      for (uint32_t row = 0; row < s.high_water; ++row) {
        if (row < seen[si].size() && seen[si][row]) continue;
        const char* rec = s.slab + size_t{row} * rec_bytes_;
        if (Freq(rec) == 0) continue;
        const KS& k = *reinterpret_cast<const KS*>(rec);
        const int64_t slot = FindSlotStored(s, k, KO::HashStored(k));
        if (slot >= 0) EraseSlot(s, slot);
      }
    }
    return absl::OkStatus();
  }

  // ------------------------------------------------------ column groups --

  int NumGroups() const override { return groups_.load(); }

  Status EnsureGroups(const std::vector<double>& fills) override {
    const int want = static_cast<int>(fills.size()) + 1;
    if (want > kMaxGroups) {
      return absl::InvalidArgumentError(absl::StrCat("a table keeps at most ", kMaxGroups - 1,
                                                     " slot groups, asked for ", want - 1));
    }
    // Groups are only ever added, and a group's fill never changes: the usual
    // call (every group there) checks without taking the locks.
    if (want <= groups_.load()) return CheckFills(fills);
    auto locks = LockAll();
    const int have = groups_.load();
    TF_RETURN_IF_ERROR(CheckFills(fills));
    if (want <= have) return absl::OkStatus();
    // Every record is rewritten wider; the slabs are allocated first, so that a
    // failure leaves the table as it was. Row ids (so the index) stay.
    const size_t old_rec = rec_bytes_, new_rec = RecBytes(want);
    std::vector<char*> slabs(num_shards_, nullptr);
    for (int si = 0; si < num_shards_; ++si) {
      if (shards_[si].slab_rows == 0) continue;
      slabs[si] = static_cast<char*>(BigAlloc(shards_[si].slab_rows * new_rec));
      if (slabs[si] == nullptr) {
        for (int j = 0; j < si; ++j) {
          if (slabs[j] != nullptr) BigFree(slabs[j], shards_[j].slab_rows * new_rec);
        }
        return absl::ResourceExhaustedError("cannot widen a table's records for slot groups");
      }
    }
    for (int g = have; g < want; ++g) fills_[g] = fills[g - 1];
    const size_t used = GroupOff(have);
    for (int si = 0; si < num_shards_; ++si) {
      Shard& s = shards_[si];
      if (slabs[si] == nullptr) continue;
      for (uint32_t row = 0; row < s.high_water; ++row) {
        char* dst = slabs[si] + size_t{row} * new_rec;
        std::memcpy(dst, s.slab + size_t{row} * old_rec, used);
        for (int g = have; g < want; ++g) {
          V* cols = reinterpret_cast<V*>(dst + GroupOff(g));
          std::fill(cols, cols + cfg_.dim, FromDouble<V>(fills_[g]));
        }
      }
      BigFree(s.slab, s.slab_rows * old_rec);
      s.slab = slabs[si];
      s.faulted_rows = s.high_water;
    }
    rec_bytes_ = new_rec;
    prefetch_bytes_ = std::min<size_t>(rec_bytes_, 512);
    groups_.store(want);
    return absl::OkStatus();
  }

  // Whether the existing groups among 1..fills.size() start at those fills.
  Status CheckFills(const std::vector<double>& fills) const {
    const int have = std::min<int>(groups_.load(), static_cast<int>(fills.size()) + 1);
    for (int g = 1; g < have; ++g) {
      const double a = fills_[g], c = fills[g - 1];
      if (!(a == c || (std::isnan(a) && std::isnan(c)))) {
        return absl::InvalidArgumentError(absl::StrCat("slot group ", g, " of this table starts at ", a,
                                                       ", not ", c));
      }
    }
    return absl::OkStatus();
  }

  Status FindGroups(OpKernelContext* ctx, const Tensor& keys, const std::vector<int>& groups,
                    const std::vector<Tensor*>& values, Tensor* exists) override {
    for (int g : groups) TF_RETURN_IF_ERROR(CheckGroup(g));
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const int64_t dim = cfg_.dim;
    const size_t n = groups.size();
    std::vector<V*> out(n);
    std::vector<V> fill(n);
    for (size_t j = 0; j < n; ++j) {
      out[j] = values[j]->flat<V>().data();
      fill[j] = FromDouble<V>(groups[j] == 0 ? 0.0 : fills_[groups[j]]);
    }
    bool* ex = exists->flat<bool>().data();
    return ForEachShard(ctx, b, Lock::kShared, [&](Shard& s, int64_t lo, int64_t hi) {
      auto pre = [&](int64_t i) {
        for (size_t j = 0; j < n; ++j) PrefetchRow(out[j] + i * dim, /*write=*/true);
      };
      return ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t, int64_t row) {
        ex[i] = row >= 0;
        for (size_t j = 0; j < n; ++j) {
          V* dst = out[j] + i * dim;
          if (row < 0) {
            std::fill(dst, dst + dim, fill[j]);
          } else {
            std::memcpy(dst, GVals(s, row, groups[j]), row_bytes_);
          }
        }
        return absl::OkStatus();
      });
    });
  }

  Status UpsertGroups(OpKernelContext* ctx, const Tensor& keys, const std::vector<int>& groups,
                      const std::vector<const Tensor*>& values) override {
    for (int g : groups) TF_RETURN_IF_ERROR(CheckGroup(g));
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const int64_t dim = cfg_.dim;
    const size_t n = groups.size();
    std::vector<const V*> in(n);
    for (size_t j = 0; j < n; ++j) in[j] = values[j]->flat<V>().data();
    // The usual call writes every group: a new key needs no start values.
    std::vector<int> sorted(groups);
    std::sort(sorted.begin(), sorted.end());
    bool distinct_prefix = true;
    for (size_t j = 0; j < n; ++j) distinct_prefix = distinct_prefix && sorted[j] == static_cast<int>(j);
    const bool has_row = sorted.front() == 0;
    const uint32_t stamp = CurrentStamp();
    return ForEachShard(ctx, b, Lock::kExclusive, [&](Shard& s, int64_t lo, int64_t hi) {
      PrepareNewRows(s, static_cast<size_t>(hi - lo));
      NoteWriteStamp(s, stamp);
      auto pre = [&](int64_t i) {
        for (size_t j = 0; j < n; ++j) PrefetchRow(in[j] + i * dim, /*write=*/false);
      };
      return ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) -> Status {
        bool fresh = false;
        if (row < 0) {
          // Read under the shard's lock (groups are added with every shard
          // locked), per key: a bounded insert may let go of it (InsertNewBounded).
          const bool whole = distinct_prefix && static_cast<int>(n) == groups_.load();
          uint32_t r;
          TF_RETURN_IF_ERROR(InsertNewBounded(s, b, b.keys[i], h, stamp, &r, &fresh,
                                              whole ? kAllGroupsWritten : -1));
          row = r;
        }
        for (size_t j = 0; j < n; ++j) {
          std::memcpy(GVals(s, row, groups[j]), in[j] + i * dim, row_bytes_);
        }
        if (fresh) {
          SetMeta(s, row, stamp, 1);
        } else if (has_row) {
          SetMeta(s, row, stamp, BumpFreq(s, row));
        }
        return absl::OkStatus();
      });
    });
  }

  Status Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) override {
    int64_t count = 0;
    for (int si = 0; si < num_shards_; ++si) {
      Shard& s = shards_[si];
      std::unique_lock<std::shared_mutex> l(s.mu);
      for (uint32_t row = 0; row < s.high_water; ++row) {
        const char* rec = s.slab + size_t{row} * rec_bytes_;
        const uint32_t f = Freq(rec);
        if (f == 0) continue;
        if (static_cast<int64_t>(Stamp(rec)) >= min_stamp && static_cast<int64_t>(f) >= min_freq) continue;
        const KS& k = *reinterpret_cast<const KS*>(rec);
        const int64_t slot = FindSlotStored(s, k, KO::HashStored(k));
        if (slot >= 0) {
          EraseSlot(s, slot);
          ++count;
        }
      }
      MaybeCompact(s);
    }
    *removed = count;
    return absl::OkStatus();
  }

  // ---------------------------------------------------------- file I/O --

  // Streaming file save/load: de_table_io.h.
  Status SaveToFile(const std::string& path, int group) override;
  Status LoadFromFile(const std::string& path, int group, int64_t* loaded) override;

 private:
  // ------------------------------------------------------------ helpers --

  static uint32_t ClampU32(int64_t v) {
    return v < 0 ? 0 : (v > static_cast<int64_t>(UINT32_MAX) ? UINT32_MAX : static_cast<uint32_t>(v));
  }
  static std::string TypeName(uint32_t t) {
    return tensorflow::DataType_IsValid(static_cast<int>(t))
               ? tensorflow::DataTypeString(static_cast<DataType>(t))
               : absl::StrCat("dtype#", t);
  }
  // Prefetches the first bytes of a batch row (the rest streams in behind).
  void PrefetchRow(const V* row, bool write) const {
    const char* p = reinterpret_cast<const char*>(row);
    for (size_t off = 0; off < std::min<size_t>(row_bytes_, 512); off += 64) {
      if (write) {
        __builtin_prefetch(p + off, 1);
      } else {
        __builtin_prefetch(p + off, 0);
      }
    }
  }

  int ShardOf(uint64_t h) const {
    return shard_bits_ == 0 ? 0 : static_cast<int>(h >> (64 - shard_bits_));
  }
  const KS& KeyAt(const Shard& s, uint32_t row) const {
    return *reinterpret_cast<const KS*>(s.slab + size_t{row} * rec_bytes_);
  }
  V* Vals(const Shard& s, int64_t row) const {
    return reinterpret_cast<V*>(s.slab + static_cast<size_t>(row) * rec_bytes_ + val_off_);
  }
  size_t GroupOff(int group) const { return val_off_ + static_cast<size_t>(group) * row_bytes_; }
  V* GVals(const Shard& s, int64_t row, int group) const {
    return reinterpret_cast<V*>(s.slab + static_cast<size_t>(row) * rec_bytes_ + GroupOff(group));
  }
  size_t RecBytes(int groups) const {
    return AlignUp(GroupOff(groups), std::max<size_t>({alignof(KS), alignof(V), 4}));
  }
  Status CheckGroup(int group) const {
    const int n = groups_.load();
    if (group >= 0 && group < n) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("column group ", group, " does not exist; the table has ",
                                                   n, " (0: rows, 1..: slot groups)"));
  }
  // Sets group `group` (>= 1) of every live row of `s` to its fill.
  void FillGroup(const Shard& s, int group) const {
    const V c = FromDouble<V>(fills_[group]);
    for (uint32_t row = 0; row < s.high_water; ++row) {
      if (Freq(s.slab + size_t{row} * rec_bytes_) == 0) continue;
      V* cols = GVals(s, row, group);
      std::fill(cols, cols + cfg_.dim, c);
    }
  }
  // A new record's groups other than `written` (-1: none written yet) start at
  // zero (the row) or their fill (slot groups).
  static constexpr int kAllGroupsWritten = kMaxGroups;
  void InitGroups(const Shard& s, uint32_t row, int written) const {
    const int n = groups_.load(std::memory_order_relaxed);
    if (written == kAllGroupsWritten || (n == 1 && written == 0)) return;
    for (int g = 0; g < n; ++g) {
      if (g == written) continue;
      V* cols = GVals(s, row, g);
      std::fill(cols, cols + cfg_.dim, FromDouble<V>(g == 0 ? 0.0 : fills_[g]));
    }
  }

  uint32_t Stamp(const char* rec) const {
    uint32_t v;
    std::memcpy(&v, rec + stamp_off_, 4);
    return v;
  }
  uint32_t Freq(const char* rec) const {
    uint32_t v;
    std::memcpy(&v, rec + freq_off_, 4);
    return v;
  }
  void SetMeta(const Shard& s, int64_t row, uint32_t stamp, uint32_t freq) const {
    char* rec = s.slab + static_cast<size_t>(row) * rec_bytes_;
    std::memcpy(rec + stamp_off_, &stamp, 4);
    std::memcpy(rec + freq_off_, &freq, 4);
  }
  void WriteRow(const Shard& s, int64_t row, const V* src, uint32_t stamp, uint32_t freq) const {
    std::memcpy(Vals(s, row), src, row_bytes_);
    SetMeta(s, row, stamp, freq);
  }
  uint32_t BumpFreq(const Shard& s, int64_t row) const {
    const uint32_t f = Freq(s.slab + static_cast<size_t>(row) * rec_bytes_);
    return f == UINT32_MAX ? f : f + 1;  // saturating
  }

  // The hash a key's initial row is drawn from: the table's key hash, except
  // for string keys drawn by the keyed recipe (TF's FarmHash fingerprint).
  static uint64_t InitHash(const InitSpec& init, const KIn& key, uint64_t h) {
    if constexpr (std::is_same<KIn, tensorflow::tstring>::value) {
      if (init.keyed && init.kind != InitSpec::kConstant) return KeyedStringHash(key.data(), key.size());
    }
    return h;
  }

  // The row seed of a key's initial row: column j uses the (j+1)-th output of
  // RowRng(row seed) (keyed_random.py).
  static uint64_t RowSeed(const InitSpec& init, uint64_t key_hash) {
    return key_hash ^ Mix64(init.seed + kSeedSalt);
  }

  // Whether rows of `init` are keyed (truncated) normal rows that round through
  // float: drawn many rows at a time (KeyedNormalRowsFloat, checked against the
  // exact doubles): the rows' tails, a few columns each, then fill the vectors together.
  static bool KeyedFloatRows(const InitSpec& init) {
    return init.keyed && !std::is_same<V, double>::value &&
           (init.kind == InitSpec::kNormal || init.kind == InitSpec::kTruncatedNormal);
  }

  // Keyed float rows drawn together (InitRows, KeyedRows), of rows up to kInitBatchMaxDim.
  static constexpr int kInitBatch = 16;
  static constexpr int64_t kInitBatchMaxDim = 4096;

  // Collects the missing keys' rows of one pass and draws them (Add, then
  // Flush): keyed float rows kInitBatch at a time, others at once.
  class InitRows {
   public:
    InitRows(const Table& table, const InitSpec& init)
        : table_(table), init_(init),
          // Rows of thousands of columns fill the draws' vectors alone (and a batch of
          // them would take a large buffer in float16 / bfloat16 tables).
          batched_(KeyedFloatRows(init) && table.cfg_.dim <= kInitBatchMaxDim) {}
    ~InitRows() { Flush(); }
    void Add(uint64_t key_hash, V* dst) {
      if (!batched_) {
        table_.FillInit(init_, key_hash, dst);
        return;
      }
      seeds_[count_] = RowSeed(init_, key_hash);
      dst_[count_++] = dst;
      if (count_ == kInitBatch) Flush();
    }
    void Flush() {
      if (count_ == 0) return;
      table_.KeyedRows(init_, seeds_, count_, dst_);
      count_ = 0;
    }

   private:
    const Table& table_;
    const InitSpec& init_;
    const bool batched_;
    int count_ = 0;
    uint64_t seeds_[kInitBatch];
    V* dst_[kInitBatch];
  };

  void FillInit(const InitSpec& init, uint64_t key_hash, V* dst) const {
    const int64_t dim = cfg_.dim;
    const double a = init.a, b = init.b;
    if (init.kind == InitSpec::kConstant) {
      if (init.row != nullptr) {
        for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(init.row[j]);
        return;
      }
      const V c = FromDouble<V>(a);
      for (int64_t j = 0; j < dim; ++j) dst[j] = c;
      return;
    }
    const uint64_t row_seed = RowSeed(init, key_hash);
    if (init.keyed && init.kind != InitSpec::kUniform) {  // (truncated) normal rows
      if constexpr (std::is_same<V, double>::value) {
        KeyedNormalRow(row_seed, dim, a, b, init.kind == InitSpec::kTruncatedNormal, dst);
      } else {
        KeyedRows(init, &row_seed, 1, &dst);
      }
      return;
    }
    RowRng rng(row_seed);
    switch (init.kind) {
      case InitSpec::kUniform: {
        const double width = b - a;
        if constexpr (std::is_same<V, float>::value) {
          UniformRow(row_seed, dim, a, width, dst);  // the same floats as the loop below
        } else {
          for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + width * rng.Uniform());
        }
        break;
      }
      case InitSpec::kNormal:
        if (dim < kBoxMullerMinDim) {
          rng.Normals(dim, [&](int64_t j, double z) { dst[j] = FromDouble<V>(a + b * z); });
        } else if constexpr (std::is_same<V, float>::value) {
          NormalRow(row_seed, dim, static_cast<float>(a), static_cast<float>(b), dst);
        } else {
          thread_local std::vector<float> z;
          z.resize(static_cast<size_t>(dim));
          NormalRow(row_seed, dim, 0.0f, 1.0f, z.data());
          for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + b * static_cast<double>(z[j]));
        }
        break;
      default:  // truncated normal: within two standard deviations
        if (dim >= kBoxMullerMinDim) {
          thread_local std::vector<float> z;
          z.resize(static_cast<size_t>(dim));
          TruncatedNormalRow(row_seed, dim, z.data());
          for (int64_t j = 0; j < dim; ++j) dst[j] = FromDouble<V>(a + b * static_cast<double>(z[j]));
        } else {  // redraw beyond two standard deviations
          for (int64_t j = 0; j < dim; ++j) {
            double z;
            do z = rng.Normal(); while (z < -2.0 || z > 2.0);
            dst[j] = FromDouble<V>(a + b * z);
          }
        }
    }
  }

  // Keyed (truncated) normal rows of float, float16 and bfloat16 tables for `count`
  // (<= kInitBatch) row seeds: float rows, rounded to V (as FromDouble<V>: through float).
  void KeyedRows(const InitSpec& init, const uint64_t* seeds, int count, V* const* dst) const {
    const bool truncated = init.kind == InitSpec::kTruncatedNormal;
    if constexpr (std::is_same<V, float>::value) {
      KeyedNormalRowsFloat(seeds, count, cfg_.dim, init.a, init.b, truncated, dst);
    } else {
      const size_t dim = static_cast<size_t>(cfg_.dim);
      thread_local std::vector<float> buf;
      buf.resize(dim * static_cast<size_t>(count));
      float* rows[kInitBatch];
      for (int k = 0; k < count; ++k) rows[k] = buf.data() + k * dim;
      KeyedNormalRowsFloat(seeds, count, cfg_.dim, init.a, init.b, truncated, rows);
      for (int k = 0; k < count; ++k) {
        for (size_t j = 0; j < dim; ++j) dst[k][j] = static_cast<V>(rows[k][j]);
      }
    }
  }

  // Hashes the keys and buckets them by shard (stable): b->order[p] is the key
  // index at position p and b->hash[p] its hash, so each shard's run is
  // [start[s], start[s+1]) and reads its hashes sequentially. A large batch is
  // cut into parts hashed and scattered in parallel (a serial pass left the
  // other core idle for ~4% of a dim-8 lookup): each part counts its keys per
  // shard, and within a shard's run part 0's keys come first, then part 1's...,
  // which keeps batch order.
  Status Partition(OpKernelContext* ctx, const Tensor& keys, Batch* b) const {
    b->keys = keys.flat<KIn>().data();
    b->n = keys.NumElements();
    const int64_t n = b->n;
    const auto* w = ctx ? ctx->device()->tensorflow_cpu_worker_threads() : nullptr;
    const int parts = (w == nullptr || n < kParallelPartitionKeys)
                          ? 1 : std::max(1, std::min(w->num_threads, 8));
    const size_t shards = static_cast<size_t>(num_shards_);
    auto first = [&](int part) { return n * part / parts; };
    auto for_each_part = [&](auto&& fn) {
      if (parts == 1) return fn(0);
      tensorflow::Shard(parts, w->workers, parts, /*cost_per_unit=*/1 << 20,
                        [&](int64_t lo, int64_t hi) {
                          for (int64_t part = lo; part < hi; ++part) fn(static_cast<int>(part));
                        });
    };
    std::vector<uint64_t> by_key(n);
    std::vector<int64_t> next(parts * shards, 0);  // per part and shard: count, then position
    for_each_part([&](int part) {
      int64_t* count = &next[part * shards];
      for (int64_t i = first(part); i < first(part + 1); ++i) {
        const uint64_t h = KO::Hash(b->keys[i]);
        by_key[i] = h;
        ++count[ShardOf(h)];
      }
    });
    b->hash.resize(n);
    b->order.resize(n);
    b->start.assign(shards + 1, 0);
    int64_t at = 0;
    for (size_t s = 0; s < shards; ++s) {
      b->start[s] = at;
      for (int part = 0; part < parts; ++part) {
        const int64_t count = next[part * shards + s];
        next[part * shards + s] = at;
        at += count;
      }
    }
    b->start[shards] = at;
    for_each_part([&](int part) {
      int64_t* pos = &next[part * shards];
      for (int64_t i = first(part); i < first(part + 1); ++i) {
        const int64_t p = pos[ShardOf(by_key[i])]++;
        b->order[p] = i;
        b->hash[p] = by_key[i];
      }
    });
    return absl::OkStatus();
  }

  // Runs fn(shard, lo, hi) for each shard's run of batch positions, whole
  // shards per task on the intra-op pool, each shard under its lock once.
  template <class Fn>
  Status ForEachShard(OpKernelContext* ctx, const Batch& b, Lock mode, Fn&& fn) {
    std::mutex err_mu;
    Status first;
    auto work = [&](int64_t lo, int64_t hi) {
      for (int64_t si = lo; si < hi; ++si) {
        const int64_t a = b.start[si], e = b.start[si + 1];
        if (a == e) continue;
        Shard& s = shards_[si];
        Status st;
        try {
          if (mode == Lock::kShared) {
            std::shared_lock<std::shared_mutex> l(s.mu);
            st = fn(s, a, e);
          } else if (mode == Lock::kExclusive) {
            std::unique_lock<std::shared_mutex> l(s.mu);
            st = fn(s, a, e);
          } else {
            st = fn(s, a, e);
          }
        } catch (const std::bad_alloc&) {
          st = absl::ResourceExhaustedError("out of memory in a native table op");
        } catch (const std::exception& e) {
          st = absl::InvalidArgumentError(absl::StrCat("native table op: ", e.what()));
        }
        if (!st.ok()) {
          std::lock_guard<std::mutex> l(err_mu);
          if (first.ok()) first = st;
        }
      }
    };
    const auto* w = ctx ? ctx->device()->tensorflow_cpu_worker_threads() : nullptr;
    if (w == nullptr || b.n < 2048) {
      work(0, num_shards_);
    } else {
      // Cost per shard in ~ns: a few cache misses per key plus the row copy.
      const int64_t cost = (b.n / num_shards_ + 1) * (60 + static_cast<int64_t>(row_bytes_) / 8);
      tensorflow::Shard(w->num_threads, w->workers, num_shards_, cost, work);
    }
    return first;
  }

  // Prefetches the index group where a key with hash h is looked for first.
  void PrefetchGroup(const Shard& s, uint64_t h) const {
    if (s.cap == 0) return;
    __builtin_prefetch(s.slots + HomeGroup(h, s.cap) * kGroupWidth);
  }
  // The row of the first slot in a key's first index group whose tag matches
  // (-1: none), with its record prefetched; the caller verifies the key.
  // kAbsent: no tag matches and the group has an empty slot, so the key is not
  // in the shard (as long as nobody inserts before the caller looks).
  static constexpr int64_t kAbsent = -2;
  int64_t Candidate(const Shard& s, uint64_t h) const {
    if (s.cap == 0) return kAbsent;
    const uint64_t g = HomeGroup(h, s.cap);
    const SlotGroup grp(s.slots + g * kGroupWidth);
    const uint32_t m = grp.Match(TagOf(h));
    if (m == 0) return grp.MaskEmpty() != 0 ? kAbsent : -1;
    const uint32_t row = s.slots[g * kGroupWidth + LowestSlot(m)] & kRowMask;
    const char* rec = s.slab + size_t{row} * rec_bytes_;
    for (size_t off = 0; off < prefetch_bytes_; off += 64) __builtin_prefetch(rec + off);
    __builtin_prefetch(rec + rec_bytes_ - 1);
    return row;
  }

  // Calls fn(shard, key index, hash, row or -1) for every key of a read-only
  // op, in batch order. Chunks of keys run on the intra-op pool,
  // each with every shard locked shared (in index order, as LockAll), so keys
  // need no bucketing by shard and output rows are written in order, which
  // the hardware streams, instead of scattered across the batch. Writers wait
  // for at most one chunk.
  template <class Fn>
  Status ForEachKeyInOrder(OpKernelContext* ctx, const Tensor& keys, Fn&& fn) const {
    const KIn* k = keys.flat<KIn>().data();
    const int64_t n = keys.NumElements();
    // Chunks small enough for every thread to get a few, large enough that
    // taking all shard locks (~1-2 us) stays below a nanosecond per key.
    const auto* w = ctx ? ctx->device()->tensorflow_cpu_worker_threads() : nullptr;
    const int64_t threads = w ? std::max(1, w->num_threads) : 1;
    const int64_t chunk = std::clamp<int64_t>(n / (4 * threads), 512, 4096);
    const int64_t chunks = (n + chunk - 1) / chunk;
    std::mutex err_mu;
    Status first;
    auto work = [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        Status st;
        {
          SharedLocks all(*this);
          try {
            st = KeysInOrder(k, c * chunk, std::min(n, (c + 1) * chunk), fn);
          } catch (const std::exception& e) {
            st = absl::InternalError(absl::StrCat("native table read: ", e.what()));
          }
        }
        if (!st.ok()) {
          std::lock_guard<std::mutex> l(err_mu);
          if (first.ok()) first = st;
        }
      }
    };
    ForEachChunk(ctx, chunks, chunk * (60 + static_cast<int64_t>(row_bytes_) / 8), work);
    return first;
  }

  // Every shard's lock held shared for a scope, taken in index order (as LockAll).
  struct SharedLocks {
    const Table& t;
    explicit SharedLocks(const Table& table) : t(table) {
      for (int i = 0; i < t.num_shards_; ++i) t.shards_[i].mu.lock_shared();
    }
    ~SharedLocks() {
      for (int i = t.num_shards_ - 1; i >= 0; --i) t.shards_[i].mu.unlock_shared();
    }
  };

  // Runs work(lo, hi) over [0, n) on the intra-op pool (inline without one);
  // `cost`: ~ns per unit.
  template <class Work>
  static void ForEachChunk(OpKernelContext* ctx, int64_t n, int64_t cost, Work&& work) {
    const auto* w = ctx ? ctx->device()->tensorflow_cpu_worker_threads() : nullptr;
    if (w == nullptr) {
      work(0, n);
    } else {
      tensorflow::Shard(w->num_threads, w->workers, n, cost, work);
    }
  }

  // The pipeline of ForEachRow (below) over keys [lo, hi) in batch order, the
  // shard found per key; the caller holds every shard's lock.
  template <class Fn>
  Status KeysInOrder(const KIn* keys, int64_t lo, int64_t hi, Fn&& fn) const {
    constexpr int64_t kFar = 32, kNear = 12, kRing = 64;  // kRing > kFar, a power of 2
    uint64_t hash[kRing];
    int64_t cand[kRing];
    auto start = [&](int64_t p) {
      const uint64_t h = KO::Hash(keys[p]);
      hash[p & (kRing - 1)] = h;
      PrefetchGroup(shards_[ShardOf(h)], h);
    };
    auto near = [&](int64_t p) {
      const uint64_t h = hash[p & (kRing - 1)];
      cand[p & (kRing - 1)] = Candidate(shards_[ShardOf(h)], h);
    };
    for (int64_t p = lo; p < std::min(hi, lo + kFar); ++p) start(p);
    for (int64_t p = lo; p < std::min(hi, lo + kNear); ++p) near(p);
    for (int64_t p = lo; p < hi; ++p) {
      if (p + kFar < hi) start(p + kFar);
      if (p + kNear < hi) near(p + kNear);
      const uint64_t h = hash[p & (kRing - 1)];
      const Shard& s = shards_[ShardOf(h)];
      int64_t row = cand[p & (kRing - 1)];
      if (row == kAbsent) {  // final: no writer runs while the caller holds the locks
        row = -1;
      } else if (row < 0 || !KO::Eq(KeyAt(s, static_cast<uint32_t>(row)), keys[p])) {
        row = FindRow(s, keys[p], h);
      }
      TF_RETURN_IF_ERROR(fn(s, p, h, row));
    }
    return absl::OkStatus();
  }

  // Calls fn(key index, hash, row or -1) for batch positions [lo, hi) of one
  // shard, in order. A lookup is three dependent cache misses (control group,
  // slot, record); this software pipeline prefetches the index group of the
  // key kFar ahead and the candidate record of the key kNear ahead, so many
  // misses are in flight at once. The candidate is verified when its turn
  // comes (fn may have inserted keys meanwhile) and otherwise re-probed.
  template <class Fn>
  Status ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi, Fn&& fn) const {
    return ForEachRow(s, b, lo, hi, [](int64_t) {}, fn);
  }

  // As above; pre(key index) runs kNear keys ahead, to prefetch the key's
  // input or output row (batch rows are visited in shard order, i.e. randomly).
  template <class Pre, class Fn>
  Status ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi, Pre&& pre, Fn&& fn) const {
    constexpr int64_t kFar = 32, kNear = 12, kRing = 16;
    int64_t cand[kRing];
    auto prefetch_index = [&](int64_t p) { PrefetchGroup(s, b.hash[p]); };
    auto candidate = [&](int64_t p) { return Candidate(s, b.hash[p]); };
    for (int64_t p = lo; p < std::min(hi, lo + kFar); ++p) prefetch_index(p);
    for (int64_t p = lo; p < std::min(hi, lo + kNear); ++p) {
      cand[p & (kRing - 1)] = candidate(p);
      pre(b.order[p]);
    }
    for (int64_t p = lo; p < hi; ++p) {
      if (p + kFar < hi) prefetch_index(p + kFar);
      if (p + kNear < hi) {
        cand[(p + kNear) & (kRing - 1)] = candidate(p + kNear);
        pre(b.order[p + kNear]);
      }
      const int64_t i = b.order[p];
      int64_t row = cand[p & (kRing - 1)];
      // A candidate found ahead may have been evicted (freed, or reused for
      // another key) by a bounded write of an earlier key, or by other writers
      // while that write waited without the lock (a clear or load may then
      // have replaced the shard's rows too): check it again.
      if (row < 0 || row >= static_cast<int64_t>(s.high_water) ||
          Freq(s.slab + size_t(row) * rec_bytes_) == 0 ||
          !KO::Eq(KeyAt(s, static_cast<uint32_t>(row)), b.keys[i])) {
        row = FindRow(s, b.keys[i], b.hash[p]);
      }
      TF_RETURN_IF_ERROR(fn(i, b.hash[p], row));
    }
    return absl::OkStatus();
  }

  std::vector<std::unique_lock<std::shared_mutex>> LockAll() {
    std::vector<std::unique_lock<std::shared_mutex>> locks;
    locks.reserve(num_shards_);
    for (int i = 0; i < num_shards_; ++i) locks.emplace_back(shards_[i].mu);
    return locks;
  }

  Status Upsert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values, bool accum,
                int group) {
    TF_RETURN_IF_ERROR(CheckGroup(group));
    Batch b;
    TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
    const V* in = values.flat<V>().data();
    const int64_t dim = cfg_.dim;
    const uint32_t stamp = CurrentStamp();
    return ForEachShard(ctx, b, Lock::kExclusive, [&](Shard& s, int64_t lo, int64_t hi) {
      PrepareNewRows(s, static_cast<size_t>(hi - lo));
      NoteWriteStamp(s, stamp);
      auto pre = [&](int64_t i) { PrefetchRow(in + i * dim, /*write=*/false); };
      return ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) -> Status {
        const V* src = in + i * dim;
        if (row < 0) {
          uint32_t r;
          bool fresh;
          TF_RETURN_IF_ERROR(InsertNewBounded(s, b, b.keys[i], h, stamp, &r, &fresh, group));
          if (fresh) {
            std::memcpy(GVals(s, r, group), src, row_bytes_);
            SetMeta(s, r, stamp, 1);
            return absl::OkStatus();
          }
          row = r;  // another writer added the key while this one made room
        }
        V* dst = GVals(s, row, group);
        if (accum) {
          for (int64_t j = 0; j < dim; ++j) dst[j] = static_cast<V>(dst[j] + src[j]);
        } else {
          std::memcpy(dst, src, row_bytes_);
        }
        // Writing a slot group is part of its row's update: the metadata is the row's.
        if (group == 0) SetMeta(s, row, stamp, BumpFreq(s, row));
        return absl::OkStatus();
      });
    });
  }

  // Inserts one row into a staging table (file loading); single-threaded.
  Status PutOne(const KIn& key, const V* vals, uint32_t stamp, uint32_t freq) {
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

  // -------------------------------------------------------------- index --

  template <class Eq>
  int64_t Probe(const Shard& s, uint64_t h, Eq&& eq) const {
    if (s.cap == 0) return -1;
    const uint64_t groups = s.cap / kGroupWidth;
    const uint32_t tag = TagOf(h);
    uint64_t g = HomeGroup(h, s.cap);
    for (uint64_t step = 1;; ++step) {
      const SlotGroup grp(s.slots + g * kGroupWidth);
      for (uint32_t m = grp.Match(tag); m != 0; m &= m - 1) {
        const size_t slot = g * kGroupWidth + LowestSlot(m);
        if (eq(KeyAt(s, s.slots[slot] & kRowMask))) return static_cast<int64_t>(slot);
      }
      if (grp.MaskEmpty() != 0 || step >= groups) return -1;
      g = g + 1 == groups ? 0 : g + 1;
    }
  }
  int64_t FindSlot(const Shard& s, const KIn& key, uint64_t h) const {
    return Probe(s, h, [&](const KS& k) { return KO::Eq(k, key); });
  }
  int64_t FindSlotStored(const Shard& s, const KS& key, uint64_t h) const {
    return Probe(s, h, [&](const KS& k) { return KO::EqStored(k, key); });
  }
  int64_t FindRow(const Shard& s, const KIn& key, uint64_t h) const {
    const int64_t slot = FindSlot(s, key, h);
    return slot < 0 ? int64_t{-1} : static_cast<int64_t>(s.slots[slot] & kRowMask);
  }

  // The index group where a key with hash h is looked for first: bits 7-38 of
  // h (bits 0-6 are its tag, the top bits pick its shard) scaled to the group
  // count, which need not be a power of two. Probes go on group by group.
  static uint64_t HomeGroup(uint64_t h, size_t cap) {
    return (((h >> 7) & 0xFFFFFFFFu) * (cap / kGroupWidth)) >> 32;
  }

  static size_t FirstNonFull(const uint32_t* slots, size_t cap, uint64_t h) {
    const uint64_t groups = cap / kGroupWidth;
    uint64_t g = HomeGroup(h, cap);
    for (;;) {
      const uint32_t m = SlotGroup(slots + g * kGroupWidth).MaskEmptyOrDeleted();
      if (m != 0) return g * kGroupWidth + LowestSlot(m);
      g = g + 1 == groups ? 0 : g + 1;
    }
  }

  // Adds `key` (absent when called) with a fresh row; values/meta are the caller's.
  // A training write's new key (Upsert, UpsertGroups): in a table with a bound
  // (SetBound) its place is counted first and, over the bound, rows go before it
  // is added (MakeRoom), so writers running at the same time never take the
  // table past the bound together. The caller holds `s` exclusively (through
  // ForEachShard); when the only rows left to evict lie in shards other writers
  // hold, this lets go of `s` while it waits for them (holding no lock while
  // waiting: no lock order needed), and a writer may add the key meanwhile:
  // then `*fresh` is false and `*row_out` is that key's row.
  Status InsertNewBounded(Shard& s, const Batch& b, const KIn& key, uint64_t h, uint32_t now,
                          uint32_t* row_out, bool* fresh, int written) {
    *fresh = true;
    const int64_t bound = bound_.load(std::memory_order_relaxed);
    if (bound <= 0) return InsertNew(s, key, h, row_out, written);
    const int64_t after = total_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (after > bound) {
      const int64_t need = after - bound;
      const int64_t extra = bound_extra_.load(std::memory_order_relaxed) / num_shards_;
      bool busy = false;
      const int64_t got = MakeRoom(s, b, now, need + extra, &busy);
      if (got < need && busy) {
        const int groups = groups_.load(std::memory_order_relaxed);
        const uint64_t recounts = recounts_.load(std::memory_order_relaxed);
        int64_t owed;
        {
          s.mu.unlock();
          Relock relock{s.mu};  // also when the waiting pass throws
          owed = MakeRoomWaiting(s, b, now, need - got);
        }
        // Rows still owed come from `s` itself, now that it is held again.
        if (owed > 0 && s.barren_stamp != now + 1) EvictMarking(s, Index(s), b, now, owed);
        // Groups added meanwhile are not among those the caller writes.
        if (groups_.load(std::memory_order_relaxed) != groups) written = -1;
        // A bound cleared and set again meanwhile recounted the table without
        // this write's place: take it again (the recount locks every shard, so
        // none can come between this and the insert).
        if (recounts_.load(std::memory_order_relaxed) != recounts && Bounded()) {
          total_.fetch_add(1, std::memory_order_relaxed);
        }
        const int64_t r = FindRow(s, key, h);
        if (r >= 0) {
          total_.fetch_sub(1, std::memory_order_relaxed);
          *row_out = static_cast<uint32_t>(r);
          *fresh = false;
          return absl::OkStatus();
        }
      }
    }
    Status st = InsertNew(s, key, h, row_out, written, /*counted=*/true);
    if (!st.ok()) total_.fetch_sub(1, std::memory_order_relaxed);
    return st;
  }

  // Locks a mutex again when it goes out of scope.
  struct Relock {
    std::shared_mutex& mu;
    ~Relock() { mu.lock(); }
  };

  // Evicts up to `n` rows for a bounded write holding `s`: from `s` first, then
  // from other shards whose lock is free at once (never waiting while holding
  // one: no lock order to keep); returns how many, and sets `*busy` when a shard
  // that may have rows to evict was skipped for its lock. A shard found without
  // a row to evict is skipped for the rest of the stamp, until a write at
  // another stamp touches it.
  int64_t MakeRoom(Shard& s, const Batch& b, uint32_t now, int64_t n, bool* busy) {
    const int home = Index(s);
    int64_t got = 0;
    // Below its share of the bound, `s` takes the rows from the largest shard
    // instead: evicting from the writer's own shard alone let the shards' sizes
    // drift apart without limit (each gains keys evenly but loses them in
    // chunks), and a shard keeps the rows of the largest size it ever had.
    const int64_t share = (bound_.load(std::memory_order_relaxed) + num_shards_ - 1) / num_shards_;
    const int largest = ShardSize(home) < share ? LargestShard() : home;
    if (largest != home) {
      Shard& t = shards_[largest];
      std::unique_lock<std::shared_mutex> l(t.mu, std::try_to_lock);
      if (l.owns_lock() && t.barren_stamp != now + 1) got += EvictMarking(t, largest, b, now, n);
    }
    if (got < n && s.barren_stamp != now + 1) got += EvictMarking(s, home, b, now, n - got);
    for (int d = 1; got < n && d < num_shards_; ++d) {
      const int si = (home + d) & (num_shards_ - 1);
      Shard& t = shards_[si];
      std::unique_lock<std::shared_mutex> l(t.mu, std::try_to_lock);
      if (!l.owns_lock()) {
        *busy = true;
        continue;
      }
      if (t.barren_stamp != now + 1) got += EvictMarking(t, si, b, now, n - got);
    }
    return got;
  }

  // MakeRoom's second pass, holding no lock: waits for each shard's lock but
  // `s`'s in turn, evicting up to `n` rows; returns how many are still owed.
  int64_t MakeRoomWaiting(Shard& s, const Batch& b, uint32_t now, int64_t n) {
    const int home = Index(s);
    for (int d = 1; n > 0 && d < num_shards_; ++d) {
      const int si = (home + d) & (num_shards_ - 1);
      Shard& t = shards_[si];
      std::unique_lock<std::shared_mutex> l(t.mu);
      if (t.barren_stamp != now + 1) n -= EvictMarking(t, si, b, now, n);
    }
    return n;
  }

  int Index(const Shard& s) const { return static_cast<int>(&s - shards_.get()); }
  int64_t ShardSize(int si) const { return shards_[si].size.load(std::memory_order_relaxed); }
  int LargestShard() const {
    int best = 0;
    for (int si = 1; si < num_shards_; ++si) {
      if (ShardSize(si) > ShardSize(best)) best = si;
    }
    return best;
  }

  // EvictLowest on shard `si` (locked), marking it as having no row to evict
  // at this stamp when it had fewer than `n`.
  int64_t EvictMarking(Shard& t, int si, const Batch& b, uint32_t now, int64_t n) {
    const int64_t got = EvictLowest(t, si, b, now, n);
    if (got < n) t.barren_stamp = now + 1;
    return got;
  }

  // Erases up to `n` live rows of shard `s` (index `si`, locked), the
  // lowest-scoring of those not written at stamp `now` and not holding a key of
  // the batch `b` (LRU: oldest stamp first; LFU: fewest writes, then oldest);
  // returns how many. Rows of later stamps (writers whose steps ran ahead of
  // this one's) may go too, in the same order, but only after every older row.
  // Reads the shard's records once.
  int64_t EvictLowest(Shard& s, int si, const Batch& b, uint32_t now, int64_t n) {
    if (n <= 0) return 0;
    std::vector<uint32_t> keep;  // rows of the batch's keys in this shard
    for (int64_t p = b.start[si]; p < b.start[si + 1]; ++p) {
      const int64_t r = FindRow(s, b.keys[b.order[p]], b.hash[p]);
      if (r >= 0) keep.push_back(static_cast<uint32_t>(r));
    }
    std::sort(keep.begin(), keep.end());
    const bool lfu = bound_lfu_.load(std::memory_order_relaxed);
    std::vector<std::pair<uint64_t, uint32_t>> scored;  // (score, row)
    for (uint32_t row = 0; row < s.high_water; ++row) {
      const char* rec = s.slab + size_t{row} * rec_bytes_;
      const uint32_t f = Freq(rec);
      if (f == 0) continue;
      const uint32_t stamp = Stamp(rec);
      if (stamp == now || std::binary_search(keep.begin(), keep.end(), row)) continue;
      const uint64_t score = lfu ? (uint64_t{std::min(f, 0x7FFFFFFFu)} << 32 | stamp) : uint64_t{stamp};
      scored.emplace_back(stamp > now ? score | uint64_t{1} << 63 : score, row);
    }
    if (scored.empty()) return 0;
    const size_t take = std::min(scored.size(), static_cast<size_t>(n));
    std::nth_element(scored.begin(), scored.begin() + (take - 1), scored.end());
    int64_t count = 0;
    for (size_t j = 0; j < take; ++j) {
      const KS& k = *reinterpret_cast<const KS*>(s.slab + size_t{scored[j].second} * rec_bytes_);
      const int64_t slot = FindSlotStored(s, k, KO::HashStored(k));
      if (slot >= 0) {
        EraseSlot(s, slot);
        ++count;
      }
    }
    return count;
  }

  // A write at `stamp` into `s` may leave rows that writers at other stamps may
  // evict, so a mark that `s` had none for them (MakeRoom) no longer holds.
  static void NoteWriteStamp(Shard& s, uint32_t stamp) {
    if (s.barren_stamp != stamp + 1) s.barren_stamp = 0;
  }

  // `counted`: the caller already added the key to total_ (InsertNewBounded).
  Status InsertNew(Shard& s, const KIn& key, uint64_t h, uint32_t* row_out, int written = 0,
                   bool counted = false) {
    if (s.cap == 0) TF_RETURN_IF_ERROR(Rehash(s, kGroupWidth));
    size_t slot = FirstNonFull(s.slots, s.cap, h);
    if (s.growth_left == 0 && s.slots[slot] != kDeletedSlot) {
      // Mostly tombstones: rebuild at the same size; otherwise double -- or, in a
      // bounded table, whose shards stop growing near their share of the bound,
      // grow to a load of 0.7 only (doubling left their index at a load of
      // 0.4-0.5, 6-8% of a dim-16 bound's bytes).
      const size_t live = static_cast<size_t>(s.size.load(std::memory_order_relaxed));
      size_t cap = s.cap * 2;
      if (live * 4 <= s.cap * 3) {
        cap = s.cap;
      } else if (Bounded()) {
        cap = std::min(cap, (live * 10 / 7 / kGroupWidth + 1) * kGroupWidth);
      }
      TF_RETURN_IF_ERROR(Rehash(s, cap));
      slot = FirstNonFull(s.slots, s.cap, h);
    }
    uint32_t row = 0;  // set by AllocRow (initialized to quiet -Wmaybe-uninitialized)
    TF_RETURN_IF_ERROR(AllocRow(s, &row));
    try {
      KO::Construct(s.slab + size_t{row} * rec_bytes_, key);
    } catch (const std::bad_alloc&) {
      s.free_rows.push_back(row);
      return absl::ResourceExhaustedError("out of memory storing a key");
    } catch (const std::exception& e) {
      s.free_rows.push_back(row);
      return absl::InvalidArgumentError(absl::StrCat("cannot store a key: ", e.what()));
    }
    InitGroups(s, row, written);
    if (s.slots[slot] == kEmptySlot) --s.growth_left;
    s.slots[slot] = FullSlot(h, row);
    s.size.fetch_add(1, std::memory_order_relaxed);
    if (Bounded()) {
      live_.fetch_add(1, std::memory_order_relaxed);
      if (!counted) total_.fetch_add(1, std::memory_order_relaxed);
    }
    *row_out = row;
    return absl::OkStatus();
  }

  void EraseSlot(Shard& s, int64_t slot) {
    const uint32_t row = s.slots[slot] & kRowMask;
    char* rec = s.slab + size_t{row} * rec_bytes_;
    KO::Destroy(rec);
    SetMeta(s, row, 0, 0);  // freq 0 marks the row free
    s.free_rows.push_back(row);
    // A group that still has an empty slot ends every probe that reaches it,
    // so no probe continues past it and the slot may become empty again.
    const size_t g = static_cast<size_t>(slot) / kGroupWidth * kGroupWidth;
    if (SlotGroup(s.slots + g).MaskEmpty() != 0) {
      s.slots[slot] = kEmptySlot;
      ++s.growth_left;
    } else {
      s.slots[slot] = kDeletedSlot;
    }
    s.size.fetch_sub(1, std::memory_order_relaxed);
    if (Bounded()) {
      total_.fetch_sub(1, std::memory_order_relaxed);
      live_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  Status Rehash(Shard& s, size_t new_cap) {
    uint32_t* nslots = static_cast<uint32_t*>(BigAlloc(new_cap * 4, /*populate=*/true));
    if (nslots == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot grow a table shard index to ", new_cap, " slots"));
    }
    std::memset(nslots, 0xFF, new_cap * 4);  // all kEmptySlot
    // The live rows are exactly the slab's rows with freq != 0 (every insert
    // writes freq >= 1 right after placing its key; erasing writes 0), so the
    // keys are read by one sequential pass over the slab, which the hardware
    // prefetcher streams, instead of one random record read per index slot.
    constexpr uint32_t kAhead = 8;  // wide records step past what the prefetcher follows
    for (uint32_t row = 0; row < s.high_water; ++row) {
      const char* rec = s.slab + size_t{row} * rec_bytes_;
      if (row + kAhead < s.high_water) __builtin_prefetch(rec + kAhead * rec_bytes_);
      if (Freq(rec) == 0) continue;
      const uint64_t h = KO::HashStored(*reinterpret_cast<const KS*>(rec));
      nslots[FirstNonFull(nslots, new_cap, h)] = FullSlot(h, row);
    }
    BigFree(s.slots, s.cap * 4);
    s.slots = nslots;
    s.cap = new_cap;
    s.growth_left = new_cap - new_cap / 8 - static_cast<size_t>(s.size.load(std::memory_order_relaxed));
    return absl::OkStatus();
  }

  // After removals from `s` (held exclusively; the caller keeps none of its
  // rows): gives back the rows it no longer needs, when they are worth it. A
  // bounded table's shard keeps up to its share of the bound (rows it fills
  // again); without that, every shard kept the rows of the most keys it ever
  // held, and shards' sizes differ by chance. An unbounded table's shard
  // compacts once a quarter of its rows are free (a large removal, a TTL sweep).
  void MaybeCompact(Shard& s) {
    const size_t live = static_cast<size_t>(s.size.load(std::memory_order_relaxed));
    // Free rows not worth moving rows for: a page's (fewer in a small shard, so
    // that small tables compact too).
    const size_t keep = std::min<size_t>(4096 / rec_bytes_, s.high_water / 8);
    size_t target = live;
    if (Bounded()) {
      const int64_t bound = bound_.load(std::memory_order_relaxed);
      target = std::max(live, static_cast<size_t>((bound + num_shards_ - 1) / num_shards_));
    } else if (s.free_rows.size() * 4 <= s.high_water) {
      return;
    }
    if (s.high_water <= target + keep || ScanOpen()) return;
    Compact(s, target);
  }

  // Moves the live rows of `s` at or above `target` (>= its size) into its
  // lowest free rows, repointing their index slots, and releases the pages
  // past the new top. Chunked export cursors into `s` become stale (see Export).
  void Compact(Shard& s, size_t target) {
    std::vector<uint32_t> holes;
    for (uint32_t r : s.free_rows) {
      if (r < target) holes.push_back(r);
    }
    size_t movers = 0;
    for (uint32_t row = static_cast<uint32_t>(target); row < s.high_water; ++row) {
      movers += Freq(s.slab + size_t{row} * rec_bytes_) != 0;
    }
    if (movers > holes.size()) return;  // the free list is short of holes: keep all rows
    std::sort(holes.begin(), holes.end());
    size_t used = 0;
    for (uint32_t row = static_cast<uint32_t>(target); row < s.high_water; ++row) {
      char* rec = s.slab + size_t{row} * rec_bytes_;
      if (Freq(rec) == 0) continue;
      const KS& k = *reinterpret_cast<const KS*>(rec);
      const uint64_t h = KO::HashStored(k);
      const int64_t slot = FindSlotStored(s, k, h);
      if (slot >= 0) {  // (a row no slot points at is unreachable: it is dropped)
        const uint32_t to = holes[used++];
        // A record moves as its bytes: a long key's heap block goes with it.
        std::memcpy(s.slab + size_t{to} * rec_bytes_, rec, rec_bytes_);
        s.slots[slot] = FullSlot(h, to);
      }
      SetMeta(s, row, 0, 0);  // rows past the top read as free when handed out again
    }
    s.free_rows.assign(holes.begin() + used, holes.end());
    s.free_rows.shrink_to_fit();
    const size_t top = std::max<size_t>(s.faulted_rows, s.high_water);
    if (s.slab_rows * rec_bytes_ >= kMmapMin) {
      ReleasePages(s.slab + target * rec_bytes_, (top - target) * rec_bytes_);
    }
    s.high_water = static_cast<uint32_t>(target);
    s.faulted_rows = std::min(s.faulted_rows, target);
    ++s.compactions;
  }

  // Whether a registered chunked export is open; one idle for kScanLeaseNs
  // counts as abandoned (its next chunk then fails if its shard compacted).
  bool ScanOpen() {
    if (scans_open_.load() <= 0) return false;
    if (NowNs() - scan_seen_ns_.load() < kScanLeaseNs) return true;
    scans_open_.store(0);
    return false;
  }
  void CloseScan() {
    int64_t n = scans_open_.load();
    while (n > 0 && !scans_open_.compare_exchange_weak(n, n - 1)) {
    }
  }
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  Status AllocRow(Shard& s, uint32_t* row) {
    if (!s.free_rows.empty()) {
      *row = s.free_rows.back();
      s.free_rows.pop_back();
      return absl::OkStatus();
    }
    if (s.high_water == s.slab_rows) TF_RETURN_IF_ERROR(GrowSlab(s, s.slab_rows + 1));
    FaultAhead(s);
    *row = s.high_water++;
    return absl::OkStatus();
  }

  // Doubles the slab (at least to `min_rows`, at most 2^kRowBits rows).
  Status GrowSlab(Shard& s, size_t min_rows) {
    constexpr size_t kMaxRows = size_t{kRowMask} + 1;
    if (s.slab_rows >= kMaxRows) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a table shard is full (2^", kRowBits, " rows); create the table with more num_shards"));
    }
    const size_t want = std::min(kMaxRows, std::max<size_t>({16, s.slab_rows * 2, min_rows}));
    void* p = BigRealloc(s.slab, s.slab_rows * rec_bytes_, want * rec_bytes_);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot grow a table shard to ", want, " rows of ",
                                                       rec_bytes_, " bytes"));
    }
    s.slab = static_cast<char*>(p);
    s.slab_rows = want;
    return absl::OkStatus();
  }

  // Before a batch that may create up to `n` rows in shard `s`: reserves them
  // (virtual space only) and lets AllocRow fault their pages in ahead, a chunk
  // per call, up to `n` rows. In chunks, because `n` counts every key of the
  // batch, also those the table already holds: faulting all `n` at once left a
  // batch of rows resident that a table not growing never used. A bounded table
  // faults none past the room its bound leaves (at the bound, a new key takes
  // the row an eviction freed).
  void PrepareNewRows(Shard& s, size_t n) {
    n -= std::min(n, s.free_rows.size());
    if (Bounded()) {
      const int64_t room = bound_.load(std::memory_order_relaxed) - total_.load(std::memory_order_relaxed);
      n = std::min<size_t>(n, static_cast<size_t>(std::max<int64_t>(0, room)));
    }
    s.fault_ahead = n;
    const size_t end = std::min<size_t>(size_t{kRowMask} + 1, size_t{s.high_water} + n);
    if (end > s.slab_rows) GrowSlab(s, end).IgnoreError();  // AllocRow reports it
  }

  // Faults in the pages of the next rows of `s` past high_water, in one call
  // for up to kFaultChunkBytes (within what PrepareNewRows allowed).
  void FaultAhead(Shard& s) {
    if (s.high_water < s.faulted_rows || s.fault_ahead == 0) return;
    const size_t chunk = std::max<size_t>(1, kFaultChunkBytes / rec_bytes_);
    const size_t end = std::min<size_t>(s.slab_rows, s.high_water + std::min(s.fault_ahead, chunk));
    if (end <= s.high_water) return;
    Prefault(s.slab + size_t{s.high_water} * rec_bytes_, (end - s.high_water) * rec_bytes_);
    s.fault_ahead -= std::min(s.fault_ahead, end - s.high_water);
    s.faulted_rows = end;
  }

  // Frees everything a shard owns.
  void FreeShard(Shard* s) {
    for (uint32_t row = 0; row < s->high_water; ++row) {
      char* rec = s->slab + size_t{row} * rec_bytes_;
      if (Freq(rec) != 0) KO::Destroy(rec);
    }
    BigFree(s->slab, s->slab_rows * rec_bytes_);
    BigFree(s->slots, s->cap * 4);
    s->slab = nullptr;
    s->slab_rows = 0;
    s->high_water = 0;
    s->faulted_rows = 0;
    s->fault_ahead = 0;
    std::vector<uint32_t>().swap(s->free_rows);
    s->slots = nullptr;
    s->cap = 0;
    s->growth_left = 0;
    if (Bounded()) {
      const int64_t n = s->size.load(std::memory_order_relaxed);
      total_.fetch_sub(n, std::memory_order_relaxed);
      live_.fetch_sub(n, std::memory_order_relaxed);
    }
    s->size.store(0, std::memory_order_relaxed);
  }

  // Empties a shard. With rows > 0, sizes its index for that many keys and
  // reserves (virtual) row space; otherwise the index is made on first insert.
  Status ResetShard(Shard* s, size_t rows) {
    FreeShard(s);
    if (rows == 0) return absl::OkStatus();
    size_t cap = kGroupWidth;
    while (cap - cap / 8 < rows) cap *= 2;
    TF_RETURN_IF_ERROR(Rehash(*s, cap));
    // Pages of the reservation cost no memory until rows are written.
    void* p = BigAlloc(rows * rec_bytes_);
    if (p != nullptr) {
      s->slab = static_cast<char*>(p);
      s->slab_rows = rows;
    }
    return absl::OkStatus();
  }

  static void SwapShard(Shard* a, Shard* b) {
    std::swap(a->slots, b->slots);
    std::swap(a->cap, b->cap);
    std::swap(a->growth_left, b->growth_left);
    const int64_t sa = a->size.load(), sb = b->size.load();
    a->size.store(sb);
    b->size.store(sa);
    std::swap(a->slab, b->slab);
    std::swap(a->slab_rows, b->slab_rows);
    std::swap(a->high_water, b->high_water);
    std::swap(a->faulted_rows, b->faulted_rows);
    std::swap(a->fault_ahead, b->fault_ahead);
    a->free_rows.swap(b->free_rows);
  }

  int shard_bits_ = 0;
  int num_shards_ = 1;
  std::unique_ptr<Shard[]> shards_;
  // Keys in all shards, kept (with the shards' sizes, under their locks) only
  // while the table has a bound: unbounded writers share no counter. total_
  // also counts the keys bounded writers are about to add (InsertNewBounded);
  // live_ only those present, what Size() reports.
  std::atomic<int64_t> total_{0};
  std::atomic<int64_t> live_{0};
  // Counts the recounts of total_ (SetBound on an unbounded table), so that a
  // write that waited without its lock knows whether its place is still counted.
  std::atomic<uint64_t> recounts_{0};
  // Registered chunked exports still open, and when one last read a chunk.
  std::atomic<int64_t> scans_open_{0};
  std::atomic<int64_t> scan_seen_ns_{0};
  int64_t ShardSum() const {
    int64_t n = 0;
    for (int i = 0; i < num_shards_; ++i) n += shards_[i].size.load(std::memory_order_relaxed);
    return n;
  }
  bool Bounded() const { return bound_.load(std::memory_order_relaxed) > 0; }
  size_t stamp_off_ = 0, freq_off_ = 0, val_off_ = 0, row_bytes_ = 0, rec_bytes_ = 0;
  size_t init_rows_ = 0;
  size_t prefetch_bytes_ = 0;  // leading record bytes worth prefetching
  // Column groups: changed only with every shard locked (EnsureGroups).
  std::atomic<int> groups_{1};
  std::array<double, kMaxGroups> fills_{};

  Status ExportAll(ExportSink* sink, int64_t* next, int group) {
    std::vector<std::shared_lock<std::shared_mutex>> locks;
    locks.reserve(num_shards_);
    for (int i = 0; i < num_shards_; ++i) locks.emplace_back(shards_[i].mu);
    const int64_t n = ShardSum();  // the rows the loop below reads
    Tensor *tk, *tv, *ts, *tf;
    TF_RETURN_IF_ERROR(sink->Allocate(n, &tk, &tv, &ts, &tf));
    auto ok = tk->flat<KIn>();
    V* ov = sink->WantsValues() ? tv->flat<V>().data() : nullptr;
    int64_t* os = ts->flat<int64_t>().data();
    int64_t* of = tf->flat<int64_t>().data();
    int64_t i = 0;
    for (int si = 0; si < num_shards_; ++si) {
      const Shard& s = shards_[si];
      for (uint32_t row = 0; row < s.high_water && i < n; ++row) {
        const char* rec = s.slab + size_t{row} * rec_bytes_;
        const uint32_t f = Freq(rec);
        if (f == 0) continue;
        KO::Export(*reinterpret_cast<const KS*>(rec), &ok(i));
        if (ov != nullptr) std::memcpy(ov + i * cfg_.dim, rec + GroupOff(group), row_bytes_);
        os[i] = Stamp(rec);
        of[i] = f;
        ++i;
      }
    }
    *next = -1;
    return absl::OkStatus();
  }
};

// A new Table<K, V> for `cfg.value_dtype`; each key type's .cc file instantiates it, so the
// key types compile in parallel.
template <class K>
Status NewTableFor(const TableConfig& cfg, TableBase** out) {
  auto make = [&](auto* value_tag) -> Status {
    using V = std::remove_pointer_t<decltype(value_tag)>;
    tensorflow::core::RefCountPtr<Table<K, V>> t(new Table<K, V>(cfg));
    TF_RETURN_IF_ERROR(t->Init());
    *out = t.release();
    return absl::OkStatus();
  };
  switch (cfg.value_dtype) {
    case tensorflow::DT_HALF: return make(static_cast<Eigen::half*>(nullptr));
    case tensorflow::DT_BFLOAT16: return make(static_cast<Eigen::bfloat16*>(nullptr));
    case tensorflow::DT_FLOAT: return make(static_cast<float*>(nullptr));
    case tensorflow::DT_DOUBLE: return make(static_cast<double*>(nullptr));
    // Integer rows: what TFRA's restrict policies keep (step / count status per key).
    case tensorflow::DT_INT32: return make(static_cast<int32_t*>(nullptr));
    case tensorflow::DT_INT64: return make(static_cast<int64_t*>(nullptr));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "value_dtype must be float16, bfloat16, float32, float64, int32 or int64, got ",
          tensorflow::DataTypeString(cfg.value_dtype)));
  }
}

}  // namespace tfra_de

#include "de_table_io.h"  // NOLINT: member definitions of Table

#endif  // TFRA_DE_CC_OPS_DE_TABLE_IMPL_H_

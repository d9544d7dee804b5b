// Table<K, V>: the concurrent, compact hash table behind every native op.
//
// Layout. Keys hash to one of S shards (top hash bits); each shard owns
//  - an index (SlotIndex, de_index.h): hash -> row id, open addressing over
//    8-slot groups;
//  - a slab (RowSlab, de_slab.h): one contiguous array of fixed-size records
//      [key | u32 stamp | u32 freq | dim values | dim values per slot group]
//    with a free list; freq == 0 marks a free row. After removals a shard may
//    compact (MaybeCompact; de_compaction.h).
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
#include "de_compaction.h"
#include "de_file.h"
#include "de_index.h"
#include "de_init.h"
#include "de_keys.h"
#include "de_slab.h"
#include "de_table.h"
#include "de_util.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/types.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfra_de {

template <class K, class V>
class Table : public TableBase {
  using KO = KeyOps<K>;
  using KIn = typename KO::In;
  using KS = typename KO::Stored;

  struct alignas(64) Shard {
    mutable std::shared_mutex mu;
    SlotIndex index;
    std::atomic<int64_t> size{0};
    RowSlab rows;
    uint32_t barren_stamp = 0;   // a bound found no row to evict here at this stamp (+1);
                                 // cleared by a write at another stamp (NoteWriteStamp)
    uint32_t compactions = 0;    // times rows moved (CompactRows): chunked export cursors carry it
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
  // Chunked export cursors: bits 0-31 a row, 32-47 a shard; a scan that began
  // at cursor 0 is registered (kScanCursor), its cursors also carry the
  // shard's compaction count (bits 48-61, kCompactionMask).
  static constexpr int64_t kScanCursor = int64_t{1} << 62;
  static constexpr uint32_t kCompactionMask = (1u << 14) - 1;

 public:
  explicit Table(const TableConfig& cfg) : TableBase(cfg) {
    int s = cfg.num_shards;
    if (s <= 0) s = 64;  // enough stripes for any pool size; empty shards cost ~100 bytes
    shard_bits_ = 0;
    while ((1 << shard_bits_) < s) ++shard_bits_;
    num_shards_ = 1 << shard_bits_;
    shards_.reset(new Shard[num_shards_]);
    layout_ = RecordLayout::For<KS, V>(cfg.dim);
    init_rows_ = static_cast<size_t>(cfg.init_size / num_shards_);
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
      total += s.index.bytes() + s.rows.high_water() * layout_.rec_bytes + s.rows.free_list_bytes();
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
      std::memcpy(out + i * dim, src, layout_.row_bytes);
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
        if (p + 16 < hi) PrefetchGroup(s, b.hash[p + 16]);  // the index group of a key further ahead
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
        if (row >= 0) std::memcpy(out + i * dim, Vals(s, row), layout_.row_bytes);
        return absl::OkStatus();
      }));
      // The missing keys' rows are drawn in a pass of their own: interleaved with
      // the probes, the draws were slower than probes and draws one after the other.
      ForEachChunk(ctx, keys.NumElements(), 8 * dim, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          if (!ex[i]) FillInitRow(init, InitHash(init, key_data[i], KO::Hash(key_data[i])), dim, out + i * dim);
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
      auto pre = [&](int64_t i) { PrefetchRow(out + i * dim, /*write=*/true); };
      TF_RETURN_IF_ERROR(ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) {
        ex[i] = row >= 0;
        if (row >= 0) {
          std::memcpy(out + i * dim, Vals(s, row), layout_.row_bytes);
        } else if (insert) {
          missing.push_back(i);
          missing.push_back(static_cast<int64_t>(h));
        } else {
          FillInitRow(init, InitHash(init, b.keys[i], h), dim, out + i * dim);
        }
        return absl::OkStatus();
      }));
      if (insert) PrepareNewRows(s, missing.size() / 2);
      for (size_t j = 0; j < missing.size(); j += 2) {
        const int64_t i = missing[j];
        const uint64_t h = static_cast<uint64_t>(missing[j + 1]);
        V* dst = out + i * dim;
        const int64_t row = FindRow(s, b.keys[i], h);
        if (row >= 0) {  // an earlier duplicate in this batch created it
          std::memcpy(dst, Vals(s, row), layout_.row_bytes);
          continue;
        }
        FillInitRow(init, InitHash(init, b.keys[i], h), dim, dst);
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
        std::memcpy(out + i * dim, Vals(s, row), layout_.row_bytes);
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
      const size_t rows = s.rows.touched_rows();
      use.rows += static_cast<int64_t>(rows);
      use.records += static_cast<int64_t>(rows * layout_.rec_bytes);
      use.index += static_cast<int64_t>(s.index.bytes());
      use.other += static_cast<int64_t>(s.rows.free_list_bytes());
      if constexpr (std::is_same<K, tensorflow::tstring>::value) {  // long keys live on the heap
        for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
          const char* rec = Rec(s, row);
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
    if (cursor == 0 && scan) scans_.Open();
    if (scan) scans_.Touch();
    Status st = ExportChunk(cursor, limit, registered, scan, sink, next, group);
    if (scan && (!st.ok() || *next < 0)) scans_.Close();
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
        std::memcpy(GVals(s, row, group), in + i * dim, layout_.row_bytes);
        // A slot group's import leaves the metadata of the table's keys alone.
        if (group == 0 || fresh) SetMeta(s, row, stamp, freq);
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
    const size_t old_rec = layout_.rec_bytes, new_rec = layout_.RecBytes(want);
    std::vector<char*> slabs(num_shards_, nullptr);
    for (int si = 0; si < num_shards_; ++si) {
      if (shards_[si].rows.rows() == 0) continue;
      slabs[si] = static_cast<char*>(BigAlloc(shards_[si].rows.rows() * new_rec));
      if (slabs[si] == nullptr) {
        for (int j = 0; j < si; ++j) {
          if (slabs[j] != nullptr) BigFree(slabs[j], shards_[j].rows.rows() * new_rec);
        }
        return absl::ResourceExhaustedError("cannot widen a table's records for slot groups");
      }
    }
    for (int g = have; g < want; ++g) fills_[g] = fills[g - 1];
    const size_t used = GroupOff(have);
    for (int si = 0; si < num_shards_; ++si) {
      Shard& s = shards_[si];
      if (slabs[si] == nullptr) continue;
      for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
        char* dst = slabs[si] + size_t{row} * new_rec;
        std::memcpy(dst, s.rows.Rec(row, old_rec), used);
        for (int g = have; g < want; ++g) {
          V* cols = reinterpret_cast<V*>(dst + GroupOff(g));
          std::fill(cols, cols + cfg_.dim, FromDouble<V>(fills_[g]));
        }
      }
      s.rows.AdoptWider(slabs[si], old_rec);
    }
    layout_.SetGroups(want);
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
            std::memcpy(dst, GVals(s, row, groups[j]), layout_.row_bytes);
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
          std::memcpy(GVals(s, row, groups[j]), in[j] + i * dim, layout_.row_bytes);
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
      for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
        const char* rec = Rec(s, row);
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
    for (size_t off = 0; off < std::min<size_t>(layout_.row_bytes, 512); off += 64) {
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
  int Index(const Shard& s) const { return static_cast<int>(&s - shards_.get()); }
  char* Rec(const Shard& s, int64_t row) const {
    return s.rows.data() + static_cast<size_t>(row) * layout_.rec_bytes;
  }
  const KS& KeyAt(const Shard& s, uint32_t row) const {
    return *reinterpret_cast<const KS*>(Rec(s, row));
  }
  V* Vals(const Shard& s, int64_t row) const {
    return reinterpret_cast<V*>(Rec(s, row) + layout_.val_off);
  }
  size_t GroupOff(int group) const { return layout_.GroupOff(group); }
  V* GVals(const Shard& s, int64_t row, int group) const {
    return reinterpret_cast<V*>(Rec(s, row) + GroupOff(group));
  }
  uint32_t Stamp(const char* rec) const { return layout_.Stamp(rec); }
  uint32_t Freq(const char* rec) const { return layout_.Freq(rec); }
  void SetMeta(const Shard& s, int64_t row, uint32_t stamp, uint32_t freq) const {
    layout_.SetMeta(Rec(s, row), stamp, freq);
  }
  void WriteRow(const Shard& s, int64_t row, const V* src, uint32_t stamp, uint32_t freq) const {
    std::memcpy(Vals(s, row), src, layout_.row_bytes);
    SetMeta(s, row, stamp, freq);
  }
  uint32_t BumpFreq(const Shard& s, int64_t row) const {
    const uint32_t f = Freq(Rec(s, row));
    return f == UINT32_MAX ? f : f + 1;  // saturating
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
    for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
      if (Freq(Rec(s, row)) == 0) continue;
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
      const int64_t cost = (b.n / num_shards_ + 1) * (60 + static_cast<int64_t>(layout_.row_bytes) / 8);
      tensorflow::Shard(w->num_threads, w->workers, num_shards_, cost, work);
    }
    return first;
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
    ForEachChunk(ctx, chunks, chunk * (60 + static_cast<int64_t>(layout_.row_bytes) / 8), work);
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
      if (row < 0 || row >= static_cast<int64_t>(s.rows.high_water()) ||
          Freq(Rec(s, row)) == 0 ||
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
            std::memcpy(GVals(s, r, group), src, layout_.row_bytes);
            SetMeta(s, r, stamp, 1);
            return absl::OkStatus();
          }
          row = r;  // another writer added the key while this one made room
        }
        V* dst = GVals(s, row, group);
        if (accum) {
          for (int64_t j = 0; j < dim; ++j) dst[j] = static_cast<V>(dst[j] + src[j]);
        } else {
          std::memcpy(dst, src, layout_.row_bytes);
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

  int64_t FindSlot(const Shard& s, const KIn& key, uint64_t h) const {
    return s.index.Probe(h, [&](uint32_t row) { return KO::Eq(KeyAt(s, row), key); });
  }
  int64_t FindSlotStored(const Shard& s, const KS& key, uint64_t h) const {
    return s.index.Probe(h, [&](uint32_t row) { return KO::EqStored(KeyAt(s, row), key); });
  }
  int64_t FindRow(const Shard& s, const KIn& key, uint64_t h) const {
    const int64_t slot = FindSlot(s, key, h);
    return slot < 0 ? int64_t{-1} : static_cast<int64_t>(s.index.RowAt(slot));
  }
  // Prefetches the index group where a key with hash h is looked for first.
  void PrefetchGroup(const Shard& s, uint64_t h) const { s.index.PrefetchHome(h); }
  // The row of the first slot in a key's first index group whose tag matches
  // (-1: none), with its record prefetched; the caller verifies the key.
  // kAbsent: the key is not in the shard (SlotIndex::HomeMatch).
  static constexpr int64_t kAbsent = SlotIndex::kAbsent;
  int64_t Candidate(const Shard& s, uint64_t h) const {
    const int64_t row = s.index.HomeMatch(h);
    if (row < 0) return row;
    const char* rec = Rec(s, row);
    for (size_t off = 0; off < layout_.prefetch_bytes; off += 64) __builtin_prefetch(rec + off);
    __builtin_prefetch(rec + layout_.rec_bytes - 1);
    return row;
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
    for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
      const char* rec = Rec(s, row);
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
      const KS& k = KeyAt(s, scored[j].second);
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

  // Adds `key` (absent when called) with a fresh row; values/meta are the caller's.
  // `written`: the column group the caller writes (InitGroups); `counted`: the
  // caller already added the key to total_ (InsertNewBounded).
  Status InsertNew(Shard& s, const KIn& key, uint64_t h, uint32_t* row_out, int written = 0,
                   bool counted = false) {
    if (s.index.cap() == 0) TF_RETURN_IF_ERROR(Rehash(s, kGroupWidth));
    size_t slot = s.index.InsertSlot(h);
    if (s.index.MustGrow(slot)) {
      const size_t live = static_cast<size_t>(s.size.load(std::memory_order_relaxed));
      TF_RETURN_IF_ERROR(Rehash(s, s.index.GrownCap(live, Bounded())));
      slot = s.index.InsertSlot(h);
    }
    uint32_t row = 0;  // set by Alloc (initialized to quiet -Wmaybe-uninitialized)
    TF_RETURN_IF_ERROR(s.rows.Alloc(layout_.rec_bytes, &row));
    try {
      KO::Construct(Rec(s, row), key);
    } catch (const std::bad_alloc&) {
      s.rows.Release(row);
      return absl::ResourceExhaustedError("out of memory storing a key");
    } catch (const std::exception& e) {
      s.rows.Release(row);
      return absl::InvalidArgumentError(absl::StrCat("cannot store a key: ", e.what()));
    }
    InitGroups(s, row, written);
    s.index.Fill(slot, h, row);
    s.size.fetch_add(1, std::memory_order_relaxed);
    if (Bounded()) {
      live_.fetch_add(1, std::memory_order_relaxed);
      if (!counted) total_.fetch_add(1, std::memory_order_relaxed);
    }
    *row_out = row;
    return absl::OkStatus();
  }

  void EraseSlot(Shard& s, int64_t slot) {
    const uint32_t row = s.index.RowAt(slot);
    char* rec = Rec(s, row);
    KO::Destroy(rec);
    SetMeta(s, row, 0, 0);  // freq 0 marks the row free
    s.rows.Release(row);
    s.index.Erase(slot);
    s.size.fetch_sub(1, std::memory_order_relaxed);
    if (Bounded()) {
      total_.fetch_sub(1, std::memory_order_relaxed);
      live_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  // Rebuilds the index of `s` at `new_cap` slots. The live rows are exactly
  // the slab's rows with freq != 0, so the keys are read by one sequential
  // pass over the slab, which the hardware prefetcher streams, instead of one
  // random record read per index slot. Not inlined: growth is rare, and kept
  // out of InsertNew it leaves that path small enough for the compiler to
  // inline its probe and row allocation.
  __attribute__((noinline)) Status Rehash(Shard& s, size_t new_cap) {
    const size_t live = static_cast<size_t>(s.size.load(std::memory_order_relaxed));
    return s.index.Rebuild(new_cap, live, [&](auto&& place) {
      constexpr uint32_t kAhead = 8;  // wide records step past what the prefetcher follows
      const uint32_t top = s.rows.high_water();
      for (uint32_t row = 0; row < top; ++row) {
        const char* rec = Rec(s, row);
        if (row + kAhead < top) __builtin_prefetch(rec + kAhead * layout_.rec_bytes);
        if (Freq(rec) == 0) continue;
        place(KO::HashStored(*reinterpret_cast<const KS*>(rec)), row);
      }
    });
  }

  // After removals from `s` (held exclusively; the caller keeps none of its
  // rows): gives back the rows it no longer needs, when they are worth it
  // (CompactRows, de_compaction.h). A bounded table's shard keeps up to its
  // share of the bound (rows it fills again); without that, every shard kept
  // the rows of the most keys it ever held, and shards' sizes differ by
  // chance. An unbounded table's shard compacts once a quarter of its rows are
  // free (a large removal, a TTL sweep).
  void MaybeCompact(Shard& s) {
    const size_t live = static_cast<size_t>(s.size.load(std::memory_order_relaxed));
    const size_t high_water = s.rows.high_water();
    // Free rows not worth moving rows for: a page's (fewer in a small shard, so
    // that small tables compact too).
    const size_t keep = std::min<size_t>(4096 / layout_.rec_bytes, high_water / 8);
    size_t target = live;
    if (Bounded()) {
      const int64_t bound = bound_.load(std::memory_order_relaxed);
      target = std::max(live, static_cast<size_t>((bound + num_shards_ - 1) / num_shards_));
    } else if (s.rows.free_rows().size() * 4 <= high_water) {
      return;
    }
    if (high_water <= target + keep || scans_.Active()) return;
    if (CompactRows<KO>(s.index, s.rows, layout_, target)) ++s.compactions;
  }

  // Before a batch that may create up to `n` rows in shard `s` (RowSlab::
  // PrepareNewRows). A bounded table faults none past the room its bound leaves.
  void PrepareNewRows(Shard& s, size_t n) {
    size_t room = SIZE_MAX;
    if (Bounded()) {
      const int64_t left = bound_.load(std::memory_order_relaxed) - total_.load(std::memory_order_relaxed);
      room = static_cast<size_t>(std::max<int64_t>(0, left));
    }
    s.rows.PrepareNewRows(n, room, layout_.rec_bytes);
  }

  // Frees everything a shard owns.
  void FreeShard(Shard* s) {
    for (uint32_t row = 0; row < s->rows.high_water(); ++row) {
      char* rec = Rec(*s, row);
      if (Freq(rec) != 0) KO::Destroy(rec);
    }
    s->rows.Free(layout_.rec_bytes);
    s->index.Free();
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
    TF_RETURN_IF_ERROR(Rehash(*s, SlotIndex::CapFor(rows)));
    s->rows.Reserve(rows, layout_.rec_bytes);
    return absl::OkStatus();
  }

  static void SwapShard(Shard* a, Shard* b) {
    a->index.Swap(b->index);
    const int64_t sa = a->size.load(), sb = b->size.load();
    a->size.store(sb);
    b->size.store(sa);
    a->rows.Swap(b->rows);
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
  // Registered chunked exports still open (they hold compaction off).
  ScanRegistry scans_;
  int64_t ShardSum() const {
    int64_t n = 0;
    for (int i = 0; i < num_shards_; ++i) n += shards_[i].size.load(std::memory_order_relaxed);
    return n;
  }
  bool Bounded() const { return bound_.load(std::memory_order_relaxed) > 0; }
  // Widens with the column groups: changed only with every shard locked (EnsureGroups).
  RecordLayout layout_;
  size_t init_rows_ = 0;
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
      for (uint32_t row = 0; row < s.rows.high_water() && i < n; ++row) {
        const char* rec = Rec(s, row);
        const uint32_t f = Freq(rec);
        if (f == 0) continue;
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

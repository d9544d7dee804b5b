// Table<K, V>: the concurrent, compact hash table behind every native op. This
// header holds the class: its shards, record layout and lock discipline, the
// per-shard primitives every concern shares (look up, insert, erase a key;
// free, reset, swap a shard), and the declarations of the members the concern
// headers define. Code that uses the table includes de_table_impl.h, which
// lists those headers and includes them all.
//
// Layout. Keys hash to one of S shards (top hash bits); each shard owns
//  - an index (SlotIndex, de_index.h): hash -> row id, open addressing over
//    8-slot groups;
//  - a slab (RowSlab, de_slab.h): one contiguous array of fixed-size records
//      [key | u32 stamp | u32 freq | dim values | dim values per slot group]
//    (and a written mask once there are slot groups, de_slab.h) with a free list; freq == 0 marks a free row. After removals a shard may
//    compact (MaybeCompact; de_compaction.h).
// Growth is per shard, so at most one shard's index exists twice at a time.
//
// Concurrency. A shard's reader-writer lock guards both its index and slab.
// Batch ops hash all keys, bucket them by shard (stable counting sort, so the
// last duplicate wins as in a serial replay), and hand whole shards to TF's
// intra-op pool (de_batch.h): each shard is locked once per batch, by one
// thread. Ops that need every shard lock them in index order (LockAll,
// SharedLocks), so they cannot deadlock.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_CORE_H_
#define TFRA_DE_CC_OPS_DE_TABLE_CORE_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_compaction.h"
#include "de_index.h"
#include "de_init.h"
#include "de_keys.h"
#include "de_slab.h"
#include "de_table.h"
#include "de_util.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

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
    // Live rows with slot group g written (index g >= 1; MarkWritten, EraseSlot), so that a
    // group's size is a sum of counters as the table's is. Changed under the exclusive lock.
    std::array<std::atomic<uint32_t>, kMaxGroups> written{};
  };

  // A batch of keys bucketed by shard (Partition, de_batch.h).
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
  // InitGroups: the caller writes every group of the new record.
  static constexpr int kAllGroupsWritten = kMaxGroups;

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

  // A bounded table's size is one counter: a sum of the shards' sizes read while writers move
  // keys (evict in one shard, then add in another) could count a key twice and pass the bound.
  int64_t Size() const override {
    return Bounded() ? live_.load(std::memory_order_relaxed) : ShardSum();
  }

  int64_t GroupSize(int group) const override {
    if (group <= 0 || group >= kMaxGroups) return group == 0 ? Size() : 0;
    int64_t n = 0;
    for (int i = 0; i < num_shards_; ++i) {
      n += shards_[i].written[group].load(std::memory_order_relaxed);
    }
    return n;
  }

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

  // Row ops: de_table_ops.h.
  Status Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults, Tensor* values,
              Tensor* exists, int group) override;
  Status Contains(OpKernelContext* ctx, const Tensor& keys, Tensor* exists, int group) override;
  Status FindInit(OpKernelContext* ctx, const Tensor& keys, const InitSpec& init, bool insert,
                  void* values, bool* exists) override;
  Status InsertMissing(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                       Tensor* stored) override;
  Status Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                int group) override;
  Status Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas,
               int group) override;
  Status Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) override;
  void Clear(int group) override;

  // Export / import and files: de_table_io.h.
  Status Export(int64_t cursor, int64_t limit, ExportSink* sink, int64_t* next,
                int group) override;
  Status ExportChunk(int64_t cursor, int64_t limit, bool registered, bool scan, ExportSink* sink,
                     int64_t* next, int group);
  Status Import(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                const Tensor& stamps, const Tensor& freqs, bool clear_first,
                int group) override;
  Status SaveToFile(const std::string& path, int group) override;
  Status LoadFromFile(const std::string& path, int group, int64_t* loaded) override;

  // Column groups (optimizer slots in the records): de_groups.h.
  int NumGroups() const override;
  Status EnsureGroups(const std::vector<double>& fills) override;
  Status CheckFills(const std::vector<double>& fills) const;
  Status FindGroups(OpKernelContext* ctx, const Tensor& keys, const std::vector<int>& groups,
                    const std::vector<Tensor*>& values, Tensor* exists) override;
  Status UpsertGroups(OpKernelContext* ctx, const Tensor& keys, const std::vector<int>& groups,
                      const std::vector<const Tensor*>& values) override;

  // Optimizer updates in place: de_apply.h.
  Status ApplyGradients(OpKernelContext* ctx, const Tensor& keys, const Tensor& grads,
                        const ApplySpec& spec) override;

  // Capacity bound and eviction (LRU / LFU, TTL sweeps): de_eviction.h.
  void SetBound(int64_t max_rows, int64_t extra_rows, bool lfu) override;
  Status Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) override;

 private:
  // ------------------------------------------------------ records --

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
  // Whether slot group `group` (>= 1) was written for the key of a live row.
  bool IsWritten(const char* rec, int group) const { return (layout_.Written(rec) >> group) & 1; }
  // Notes slot groups `bits` (bit g: group g >= 1; bit 0 is ignored) written for `row`'s key.
  void MarkWritten(Shard& s, int64_t row, uint32_t bits) const {
    char* rec = Rec(s, row);
    const uint16_t old = layout_.Written(rec);
    uint32_t add = bits & ~uint32_t{old} & ~1u;
    if (add == 0) return;
    layout_.SetWritten(rec, static_cast<uint16_t>(old | add));
    for (; add != 0; add &= add - 1) {
      std::atomic<uint32_t>& n = s.written[__builtin_ctz(add)];
      n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
  }
  uint32_t BumpFreq(const Shard& s, int64_t row) const {
    const uint32_t f = Freq(Rec(s, row));
    return f == UINT32_MAX ? f : f + 1;  // saturating
  }
  // A new record's groups other than `written` (-1: none written yet) start at
  // zero (the row) or their fill (slot groups, de_groups.h).
  void InitGroups(const Shard& s, uint32_t row, int written) const {
    const int n = groups_.load(std::memory_order_relaxed);
    if (written == kAllGroupsWritten || (n == 1 && written == 0)) return;
    for (int g = 0; g < n; ++g) {
      if (g == written) continue;
      V* cols = GVals(s, row, g);
      std::fill(cols, cols + cfg_.dim, FromDouble<V>(g == 0 ? 0.0 : fills_[g]));
    }
  }
  bool Bounded() const { return bound_.load(std::memory_order_relaxed) > 0; }
  int64_t ShardSum() const {
    int64_t n = 0;
    for (int i = 0; i < num_shards_; ++i) n += shards_[i].size.load(std::memory_order_relaxed);
    return n;
  }

  // ------------------------------------------------------- lookups --

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

  // --------------------------------------------- insert and erase --

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
    layout_.SetWritten(Rec(s, row), 0);  // a new key has no slot group written
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
    for (uint32_t bits = layout_.Written(rec) & ~1u; bits != 0; bits &= bits - 1) {
      std::atomic<uint32_t>& n = s.written[__builtin_ctz(bits)];
      n.store(n.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
    }
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

  // ------------------------------------------------ shard lifecycle --

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
    for (auto& n : s->written) n.store(0, std::memory_order_relaxed);
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
    for (int g = 0; g < kMaxGroups; ++g) {
      const uint32_t wa = a->written[g].load(), wb = b->written[g].load();
      a->written[g].store(wb);
      b->written[g].store(wa);
    }
    a->rows.Swap(b->rows);
  }

  // ---------------------------------------------------------- locks --

  std::vector<std::unique_lock<std::shared_mutex>> LockAll() {
    std::vector<std::unique_lock<std::shared_mutex>> locks;
    locks.reserve(num_shards_);
    for (int i = 0; i < num_shards_; ++i) locks.emplace_back(shards_[i].mu);
    return locks;
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

  // -------------------------------------- batches (de_batch.h) --

  Status Partition(OpKernelContext* ctx, const Tensor& keys, Batch* b) const;
  template <class Fn>
  Status ForEachShard(OpKernelContext* ctx, const Batch& b, Lock mode, Fn&& fn);
  template <class Fn>
  Status ForEachKeyInOrder(OpKernelContext* ctx, const Tensor& keys, Fn&& fn) const;
  template <class Work>
  static void ForEachChunk(OpKernelContext* ctx, int64_t n, int64_t cost, Work&& work);
  template <class Fn>
  Status KeysInOrder(const KIn* keys, int64_t lo, int64_t hi, Fn&& fn) const;
  template <class Fn>
  Status ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi, Fn&& fn) const;
  template <class Pre, class Fn>
  Status ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi, Pre&& pre, Fn&& fn) const;
  void PrefetchRow(const V* row, bool write) const;

  // ------------------------------ the other concerns' private parts --

  // de_table_ops.h
  Status Upsert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values, bool accum,
                int group);
  // de_table_io.h
  Status ExportAll(ExportSink* sink, int64_t* next, int group);
  Status PutOne(const KIn& key, const V* vals, uint32_t stamp, uint32_t freq);
  // de_groups.h
  Status CheckGroup(int group) const;
  void FillGroup(Shard& s, int group);
  // de_eviction.h
  Status InsertNewBounded(Shard& s, const Batch& b, const KIn& key, uint64_t h, uint32_t now,
                          uint32_t* row_out, bool* fresh, int written);
  int64_t MakeRoom(Shard& s, const Batch& b, uint32_t now, int64_t n, bool* busy);
  int64_t MakeRoomWaiting(Shard& s, const Batch& b, uint32_t now, int64_t n);
  int64_t ShardSize(int si) const;
  int LargestShard() const;
  int64_t EvictMarking(Shard& t, int si, const Batch& b, uint32_t now, int64_t n);
  int64_t EvictLowest(Shard& s, int si, const Batch& b, uint32_t now, int64_t n);
  static void NoteWriteStamp(Shard& s, uint32_t stamp);

  // ---------------------------------------------------------- state --

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
  // Widens with the column groups: changed only with every shard locked (EnsureGroups).
  RecordLayout layout_;
  size_t init_rows_ = 0;
  // Column groups: changed only with every shard locked (EnsureGroups).
  std::atomic<int> groups_{1};
  std::array<double, kMaxGroups> fills_{};
};

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_CORE_H_

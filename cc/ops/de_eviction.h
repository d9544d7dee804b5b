// Eviction in a Table<K, V>: the capacity bound of training writes (SetBound;
// a new key over the bound first evicts the lowest-scoring rows, LRU or LFU)
// and the TTL sweep (Evict: removes rows older or rarer than given limits).
//
// A bounded table counts its keys in one counter (total_), taken before a new
// key is added, so writers running at the same time never take the table past
// the bound together. Rows to evict come from the writer's own shard, the
// largest shard, or any shard whose lock is free at once; a writer never waits
// for a lock while it holds one (no lock order to keep), and waits without its
// own when only busy shards have rows left (InsertNewBounded).
#ifndef TFRA_DE_CC_OPS_DE_EVICTION_H_
#define TFRA_DE_CC_OPS_DE_EVICTION_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "de_table_core.h"

namespace tfra_de {

// Eviction order of a live row written at `stamp`, `freq` times, for a writer
// at stamp `now` (lowest first). LRU: oldest stamp first; LFU: fewest writes,
// then oldest. Rows of later stamps (writers whose steps ran ahead of this
// one's) come after every older row.
inline uint64_t EvictionScore(uint32_t stamp, uint32_t freq, uint32_t now, bool lfu) {
  const uint64_t score = lfu ? (uint64_t{std::min(freq, 0x7FFFFFFFu)} << 32 | stamp) : uint64_t{stamp};
  return stamp > now ? score | uint64_t{1} << 63 : score;
}

// Locks a mutex again when it goes out of scope.
struct Relock {
  std::shared_mutex& mu;
  ~Relock() { mu.lock(); }
};

template <class K, class V>
inline void Table<K, V>::SetBound(int64_t max_rows, int64_t extra_rows, bool lfu) {
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

// Adds `key` (absent when called) with a fresh row, as InsertNew, for a
// training write's new key (Upsert, UpsertGroups): in a table with a bound
// (SetBound) its place is counted first and, over the bound, rows go before it
// is added (MakeRoom), so writers running at the same time never take the
// table past the bound together. The caller holds `s` exclusively (through
// ForEachShard); when the only rows left to evict lie in shards other writers
// hold, this lets go of `s` while it waits for them (holding no lock while
// waiting: no lock order needed), and a writer may add the key meanwhile:
// then `*fresh` is false and `*row_out` is that key's row.
template <class K, class V>
inline Status Table<K, V>::InsertNewBounded(Shard& s, const Batch& b, const KIn& key, uint64_t h,
                                            uint32_t now, uint32_t* row_out, bool* fresh,
                                            int written) {
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

// Evicts up to `n` rows for a bounded write holding `s`: from `s` first, then
// from other shards whose lock is free at once (never waiting while holding
// one: no lock order to keep); returns how many, and sets `*busy` when a shard
// that may have rows to evict was skipped for its lock. A shard found without
// a row to evict is skipped for the rest of the stamp, until a write at
// another stamp touches it.
template <class K, class V>
inline int64_t Table<K, V>::MakeRoom(Shard& s, const Batch& b, uint32_t now, int64_t n, bool* busy) {
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
template <class K, class V>
inline int64_t Table<K, V>::MakeRoomWaiting(Shard& s, const Batch& b, uint32_t now, int64_t n) {
  const int home = Index(s);
  for (int d = 1; n > 0 && d < num_shards_; ++d) {
    const int si = (home + d) & (num_shards_ - 1);
    Shard& t = shards_[si];
    std::unique_lock<std::shared_mutex> l(t.mu);
    if (t.barren_stamp != now + 1) n -= EvictMarking(t, si, b, now, n);
  }
  return n;
}

template <class K, class V>
inline int64_t Table<K, V>::ShardSize(int si) const {
  return shards_[si].size.load(std::memory_order_relaxed);
}

template <class K, class V>
inline int Table<K, V>::LargestShard() const {
  int best = 0;
  for (int si = 1; si < num_shards_; ++si) {
    if (ShardSize(si) > ShardSize(best)) best = si;
  }
  return best;
}

// EvictLowest on shard `si` (locked), marking it as having no row to evict
// at this stamp when it had fewer than `n`.
template <class K, class V>
inline int64_t Table<K, V>::EvictMarking(Shard& t, int si, const Batch& b, uint32_t now, int64_t n) {
  const int64_t got = EvictLowest(t, si, b, now, n);
  if (got < n) t.barren_stamp = now + 1;
  return got;
}

// Erases up to `n` live rows of shard `s` (index `si`, locked), the
// lowest-scoring (EvictionScore) of those not written at stamp `now` and not
// holding a key of the batch `b`; returns how many. Reads the shard's records
// once.
template <class K, class V>
inline int64_t Table<K, V>::EvictLowest(Shard& s, int si, const Batch& b, uint32_t now, int64_t n) {
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
    scored.emplace_back(EvictionScore(stamp, f, now, lfu), row);
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
template <class K, class V>
inline void Table<K, V>::NoteWriteStamp(Shard& s, uint32_t stamp) {
  if (s.barren_stamp != stamp + 1) s.barren_stamp = 0;
}

// The TTL sweep: removes every row written before `min_stamp` or fewer than
// `min_freq` times, a shard at a time (each compacts after its removals).
template <class K, class V>
inline Status Table<K, V>::Evict(int64_t min_stamp, int64_t min_freq, int64_t* removed) {
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

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_EVICTION_H_

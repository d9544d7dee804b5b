// How a batch of keys runs over the shards of a Table<K, V>: hashing and
// bucketing the keys by shard (Partition), handing whole shards to TF's
// intra-op pool under their locks (ForEachShard), and the software pipelines
// that hide a lookup's cache misses (ForEachRow within a shard,
// KeysInOrder / ForEachKeyInOrder across shards in batch order). Every batch
// op (de_table_ops.h, de_groups.h, de_table_io.h) is built from these, so the
// locking and prefetching live in one place.
#ifndef TFRA_DE_CC_OPS_DE_BATCH_H_
#define TFRA_DE_CC_OPS_DE_BATCH_H_

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_table_core.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tfra_de {

// Prefetches the first bytes of a batch row (the rest streams in behind).
template <class K, class V>
inline void Table<K, V>::PrefetchRow(const V* row, bool write) const {
  const char* p = reinterpret_cast<const char*>(row);
  for (size_t off = 0; off < std::min<size_t>(layout_.row_bytes, 512); off += 64) {
    if (write) {
      __builtin_prefetch(p + off, 1);
    } else {
      __builtin_prefetch(p + off, 0);
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
template <class K, class V>
inline Status Table<K, V>::Partition(OpKernelContext* ctx, const Tensor& keys, Batch* b) const {
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
template <class K, class V>
template <class Fn>
inline Status Table<K, V>::ForEachShard(OpKernelContext* ctx, const Batch& b, Lock mode, Fn&& fn) {
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
template <class K, class V>
template <class Fn>
inline Status Table<K, V>::ForEachKeyInOrder(OpKernelContext* ctx, const Tensor& keys, Fn&& fn) const {
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

// Runs work(lo, hi) over [0, n) on the intra-op pool (inline without one);
// `cost`: ~ns per unit.
template <class K, class V>
template <class Work>
inline void Table<K, V>::ForEachChunk(OpKernelContext* ctx, int64_t n, int64_t cost, Work&& work) {
  const auto* w = ctx ? ctx->device()->tensorflow_cpu_worker_threads() : nullptr;
  if (w == nullptr) {
    work(0, n);
  } else {
    tensorflow::Shard(w->num_threads, w->workers, n, cost, work);
  }
}

// The pipeline of ForEachRow (below) over keys [lo, hi) in batch order, the
// shard found per key; the caller holds every shard's lock.
template <class K, class V>
template <class Fn>
inline Status Table<K, V>::KeysInOrder(const KIn* keys, int64_t lo, int64_t hi, Fn&& fn) const {
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
template <class K, class V>
template <class Fn>
inline Status Table<K, V>::ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi,
                                      Fn&& fn) const {
  return ForEachRow(s, b, lo, hi, [](int64_t) {}, fn);
}

// As above; pre(key index) runs kNear keys ahead, to prefetch the key's
// input or output row (batch rows are visited in shard order, i.e. randomly).
template <class K, class V>
template <class Pre, class Fn>
inline Status Table<K, V>::ForEachRow(const Shard& s, const Batch& b, int64_t lo, int64_t hi,
                                      Pre&& pre, Fn&& fn) const {
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

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_BATCH_H_

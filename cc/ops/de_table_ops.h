// The row ops of a Table<K, V>: lookups (Find, Contains, FindInit), writes
// (InsertMissing, Insert, Accum) and removals (Remove, Clear), each one pass of
// the batch machinery (de_batch.h) with the shard's index and records. What a
// bound adds to a write is in de_eviction.h, column groups in de_groups.h.
#ifndef TFRA_DE_CC_OPS_DE_TABLE_OPS_H_
#define TFRA_DE_CC_OPS_DE_TABLE_OPS_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "de_batch.h"
#include "de_eviction.h"
#include "de_groups.h"
#include "de_init.h"
#include "de_table_core.h"

namespace tfra_de {

template <class K, class V>
inline Status Table<K, V>::Find(OpKernelContext* ctx, const Tensor& keys, const Tensor& defaults,
                                Tensor* values, Tensor* exists, int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  const bool per_key = defaults.dims() == 2;
  const V* dflt = defaults.flat<V>().data();
  V* out = values->flat<V>().data();
  bool* ex = exists->flat<bool>().data();
  const int64_t dim = cfg_.dim;
  auto visit = [&](const Shard& s, int64_t i, uint64_t, int64_t row) {
    // A slot group holds the keys it was written for (the others' columns are its fill).
    const bool found = row >= 0 && (group == 0 || IsWritten(Rec(s, row), group));
    ex[i] = found;
    const V* src = found ? GVals(s, row, group) : (per_key ? dflt + i * dim : dflt);
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

template <class K, class V>
inline Status Table<K, V>::Contains(OpKernelContext* ctx, const Tensor& keys, Tensor* exists,
                                    int group) {
  TF_RETURN_IF_ERROR(CheckGroup(group));
  Batch b;
  TF_RETURN_IF_ERROR(Partition(ctx, keys, &b));
  bool* ex = exists->flat<bool>().data();
  return ForEachShard(ctx, b, Lock::kShared, [&](Shard& s, int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      if (p + 16 < hi) PrefetchGroup(s, b.hash[p + 16]);  // the index group of a key further ahead
      const int64_t slot = FindSlot(s, b.keys[b.order[p]], b.hash[p]);
      // A slot group's keys are those it was written for (one record read each).
      ex[b.order[p]] = slot >= 0 && (group == 0 || IsWritten(Rec(s, s.index.RowAt(slot)), group));
    }
    return absl::OkStatus();
  });
}

template <class K, class V>
inline Status Table<K, V>::FindInit(OpKernelContext* ctx, const Tensor& keys, const InitSpec& init,
                                    bool insert, void* values, bool* exists) {
  V* out = static_cast<V*>(values);
  bool* ex = exists;
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
      InitRows<V> rows(init, dim);
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
    InitRows<V> rows(init, dim);
    auto pre = [&](int64_t i) { PrefetchRow(out + i * dim, /*write=*/true); };
    TF_RETURN_IF_ERROR(ForEachRow(s, b, lo, hi, pre, [&](int64_t i, uint64_t h, int64_t row) {
      ex[i] = row >= 0;
      if (row >= 0) {
        std::memcpy(out + i * dim, Vals(s, row), layout_.row_bytes);
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

template <class K, class V>
inline Status Table<K, V>::InsertMissing(OpKernelContext* ctx, const Tensor& keys,
                                         const Tensor& values, Tensor* stored) {
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

template <class K, class V>
inline Status Table<K, V>::Insert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                                  int group) {
  return Upsert(ctx, keys, values, /*accum=*/false, group);
}

template <class K, class V>
inline Status Table<K, V>::Accum(OpKernelContext* ctx, const Tensor& keys, const Tensor& deltas,
                                 int group) {
  return Upsert(ctx, keys, deltas, /*accum=*/true, group);
}

// A training write (Insert, Accum): a new key in a bounded table may first
// evict rows (InsertNewBounded).
template <class K, class V>
inline Status Table<K, V>::Upsert(OpKernelContext* ctx, const Tensor& keys, const Tensor& values,
                                  bool accum, int group) {
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
          MarkWritten(s, r, 1u << group);
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
      MarkWritten(s, row, 1u << group);  // (no bit for the row)
      return absl::OkStatus();
    });
  });
}

template <class K, class V>
inline Status Table<K, V>::Remove(OpKernelContext* ctx, const Tensor& keys, int64_t* removed) {
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

template <class K, class V>
inline void Table<K, V>::Clear(int group) {
  auto locks = LockAll();
  if (group <= 0 || group >= groups_.load()) {
    if (group == 0) for (int i = 0; i < num_shards_; ++i) FreeShard(&shards_[i]);
    return;
  }
  for (int i = 0; i < num_shards_; ++i) FillGroup(shards_[i], group);
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_TABLE_OPS_H_

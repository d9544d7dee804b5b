// Column groups of a Table<K, V>: an optimizer's slots kept in their
// variable's records (group 0: the row; group g >= 1: slot g, starting at its
// fill; its keys are those it was written for, the record's written mask,
// de_slab.h). EnsureGroups widens every record; FindGroups / UpsertGroups move
// several groups of a key with one probe. Groups are only ever added, and
// only with every shard locked, so a reader holding one shard's lock sees a
// fixed record layout.
#ifndef TFRA_DE_CC_OPS_DE_GROUPS_H_
#define TFRA_DE_CC_OPS_DE_GROUPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "de_batch.h"
#include "de_eviction.h"
#include "de_init.h"
#include "de_table_core.h"
#include "de_util.h"

namespace tfra_de {

template <class K, class V>
inline int Table<K, V>::NumGroups() const {
  return groups_.load();
}

template <class K, class V>
inline Status Table<K, V>::CheckGroup(int group) const {
  const int n = groups_.load();
  if (group >= 0 && group < n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("column group ", group, " does not exist; the table has ",
                                                 n, " (0: rows, 1..: slot groups)"));
}

// Sets group `group` (>= 1) of every live row of `s` to its fill, written for none.
template <class K, class V>
inline void Table<K, V>::FillGroup(Shard& s, int group) {
  const V c = FromDouble<V>(fills_[group]);
  const uint16_t keep = static_cast<uint16_t>(~(1u << group));
  for (uint32_t row = 0; row < s.rows.high_water(); ++row) {
    char* rec = Rec(s, row);
    if (Freq(rec) == 0) continue;
    V* cols = GVals(s, row, group);
    std::fill(cols, cols + cfg_.dim, c);
    layout_.SetWritten(rec, layout_.Written(rec) & keep);
  }
  s.written[group].store(0, std::memory_order_relaxed);
}

template <class K, class V>
inline Status Table<K, V>::EnsureGroups(const std::vector<double>& fills) {
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
  // failure leaves the table as it was. Row ids (so the index) stay, and so do
  // the written masks (none before the first slot group).
  const RecordLayout wide = layout_.Widened(want);
  const size_t old_rec = layout_.rec_bytes, new_rec = wide.rec_bytes;
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
      const char* src = s.rows.Rec(row, old_rec);
      std::memcpy(dst, src, used);
      wide.SetWritten(dst, layout_.Written(src));
      for (int g = have; g < want; ++g) {
        V* cols = reinterpret_cast<V*>(dst + GroupOff(g));
        std::fill(cols, cols + cfg_.dim, FromDouble<V>(fills_[g]));
      }
    }
    s.rows.AdoptWider(slabs[si], old_rec);
  }
  layout_ = wide;
  groups_.store(want);
  return absl::OkStatus();
}

// Whether the existing groups among 1..fills.size() start at those fills.
template <class K, class V>
inline Status Table<K, V>::CheckFills(const std::vector<double>& fills) const {
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

template <class K, class V>
inline Status Table<K, V>::FindGroups(OpKernelContext* ctx, const Tensor& keys,
                                      const std::vector<int>& groups,
                                      const std::vector<Tensor*>& values, Tensor* exists) {
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

template <class K, class V>
inline Status Table<K, V>::UpsertGroups(OpKernelContext* ctx, const Tensor& keys,
                                        const std::vector<int>& groups,
                                        const std::vector<const Tensor*>& values) {
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
  uint32_t bits = 0;  // the slot groups written
  for (int g : groups) bits |= 1u << g;
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
      MarkWritten(s, row, bits);
      if (fresh) {
        SetMeta(s, row, stamp, 1);
      } else if (has_row) {
        SetMeta(s, row, stamp, BumpFreq(s, row));
      }
      return absl::OkStatus();
    });
  });
}

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_GROUPS_H_

// A shard's rows: what a record holds (RecordLayout) and the allocator of row
// ids over one page-backed array of records (RowSlab).
//
// A record is [key | u32 stamp | u32 freq | dim values per column group]
// (group 0: the row; groups 1..: optimizer slots, de_groups.h), plus, once it
// has slot groups, a u16 mask of the slot groups written for its key
// (RecordLayout::mask_off). freq == 0
// marks a free row: every insert writes freq >= 1 right after placing its key
// and erasing writes 0, so the live rows are found by one sequential pass
// over the slab (rebuilds, exports, eviction) with no index lookups.
//
// The slab is grown with mremap (no copy, no resident doubling); freed rows
// are reused through a free list. Pages are faulted in ahead of new rows in
// chunks (PrepareNewRows, Alloc), and given back to the OS when compaction
// lowers the top (ShrinkTo; de_compaction.h). The class knows bytes and row
// ids only: keys are constructed and destroyed by the table (de_keys.h), and
// the caller holds the shard's lock.
#ifndef TFRA_DE_CC_OPS_DE_SLAB_H_
#define TFRA_DE_CC_OPS_DE_SLAB_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "de_util.h"
#include "tensorflow/core/platform/errors.h"

namespace tfra_de {

inline size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Byte offsets inside a record; a table's records all share one layout, which
// widens when column groups are added (Widened).
//
// The written mask: bit g set when slot group g of the key was written (a
// slot's keys are those its optimizer trained, as TFRA's separate slot
// tables hold; bit 0 is unused). Records without slot groups have none. It
// takes padding after freq where the key and value alignments leave 2 bytes
// (int32 keys, 8-byte values), else the end of the record.
struct RecordLayout {
  size_t stamp_off = 0, freq_off = 0, val_off = 0;
  size_t mask_off = 0;        // 0: no mask (a record without slot groups)
  size_t head_mask_off = 0;   // padding after freq that holds the mask, or 0
  size_t row_bytes = 0;       // one column group: dim values
  size_t rec_bytes = 0;       // a whole record, padded to `align`
  size_t prefetch_bytes = 0;  // leading record bytes worth prefetching
  size_t align = 4;           // of a record: its key's, its values', at least 4

  template <class KS, class V>
  static RecordLayout For(int64_t dim) {
    RecordLayout l;
    l.stamp_off = AlignUp(sizeof(KS), 4);
    l.freq_off = l.stamp_off + 4;
    l.val_off = AlignUp(l.freq_off + 4, alignof(V));
    if (l.val_off >= l.freq_off + 4 + 2) l.head_mask_off = l.freq_off + 4;
    l.row_bytes = static_cast<size_t>(dim) * sizeof(V);
    l.align = std::max<size_t>({alignof(KS), alignof(V), 4});
    l.SetGroups(1);
    return l;
  }

  size_t GroupOff(int group) const { return val_off + static_cast<size_t>(group) * row_bytes; }
  // This layout with `groups` column groups.
  RecordLayout Widened(int groups) const {
    RecordLayout l = *this;
    l.SetGroups(groups);
    return l;
  }
  void SetGroups(int groups) {
    size_t end = GroupOff(groups);
    mask_off = 0;
    if (groups > 1) {
      mask_off = head_mask_off != 0 ? head_mask_off : end;
      end = std::max(end, mask_off + 2);
    }
    rec_bytes = AlignUp(end, align);
    prefetch_bytes = std::min<size_t>(rec_bytes, 512);
  }

  uint32_t Stamp(const char* rec) const {
    uint32_t v;
    std::memcpy(&v, rec + stamp_off, 4);
    return v;
  }
  uint32_t Freq(const char* rec) const {
    uint32_t v;
    std::memcpy(&v, rec + freq_off, 4);
    return v;
  }
  void SetMeta(char* rec, uint32_t stamp, uint32_t freq) const {
    std::memcpy(rec + stamp_off, &stamp, 4);
    std::memcpy(rec + freq_off, &freq, 4);
  }
  uint16_t Written(const char* rec) const {
    uint16_t v = 0;
    if (mask_off != 0) std::memcpy(&v, rec + mask_off, 2);
    return v;
  }
  void SetWritten(char* rec, uint16_t bits) const {
    if (mask_off != 0) std::memcpy(rec + mask_off, &bits, 2);
  }
};

class RowSlab {
 public:
  // Alloc faults new rows' pages in ahead in chunks this large: one call per
  // chunk, and at most a chunk per shard faulted but never used.
  static constexpr size_t kFaultChunkBytes = 16384;

  char* Rec(uint32_t row, size_t rec_bytes) const { return data_ + size_t{row} * rec_bytes; }
  char* data() const { return data_; }
  size_t rows() const { return rows_; }                   // allocated rows
  uint32_t high_water() const { return high_water_; }     // rows ever handed out
  const std::vector<uint32_t>& free_rows() const { return free_rows_; }
  size_t free_list_bytes() const { return free_rows_.capacity() * 4; }
  // Rows whose pages may be resident: handed out, or faulted in ahead.
  size_t touched_rows() const { return std::max<size_t>(faulted_rows_, high_water_); }

  // A row for a new record: a free one, else the next past high_water.
  absl::Status Alloc(size_t rec_bytes, uint32_t* row) {
    if (!free_rows_.empty()) {
      *row = free_rows_.back();
      free_rows_.pop_back();
      return absl::OkStatus();
    }
    if (high_water_ == rows_) TF_RETURN_IF_ERROR(Grow(rows_ + 1, rec_bytes));
    FaultAhead(rec_bytes);
    *row = high_water_++;
    return absl::OkStatus();
  }

  // Puts a row (its record already marked free) on the free list.
  void Release(uint32_t row) { free_rows_.push_back(row); }

  // Doubles the slab (at least to `min_rows`, at most 2^kRowBits rows).
  absl::Status Grow(size_t min_rows, size_t rec_bytes) {
    constexpr size_t kMaxRows = size_t{kRowMask} + 1;
    if (rows_ >= kMaxRows) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a table shard is full (2^", kRowBits, " rows); create the table with more num_shards"));
    }
    const size_t want = std::min(kMaxRows, std::max<size_t>({16, rows_ * 2, min_rows}));
    void* p = BigRealloc(data_, rows_ * rec_bytes, want * rec_bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot grow a table shard to ", want, " rows of ",
                                                       rec_bytes, " bytes"));
    }
    data_ = static_cast<char*>(p);
    rows_ = want;
    return absl::OkStatus();
  }

  // Before a batch that may create up to `n` rows: reserves them (virtual space
  // only) and lets Alloc fault their pages in ahead, a chunk per call, up to
  // `n` rows, of which at most `room` new ones (a bounded table's room under
  // its bound: at the bound, a new key takes the row an eviction freed). In
  // chunks, because `n` counts every key of the batch, also those the table
  // already holds: faulting all `n` at once left a batch of rows resident that
  // a table not growing never used.
  void PrepareNewRows(size_t n, size_t room, size_t rec_bytes) {
    n -= std::min(n, free_rows_.size());
    n = std::min(n, room);
    fault_ahead_ = n;
    const size_t end = std::min<size_t>(size_t{kRowMask} + 1, size_t{high_water_} + n);
    if (end > rows_) Grow(end, rec_bytes).IgnoreError();  // Alloc reports it
  }

  // Reserves (virtual) space for `rows` records in an empty slab; best effort,
  // as pages of the reservation cost no memory until rows are written.
  void Reserve(size_t rows, size_t rec_bytes) {
    void* p = BigAlloc(rows * rec_bytes);
    if (p != nullptr) {
      data_ = static_cast<char*>(p);
      rows_ = rows;
    }
  }

  // Takes `wider` (rows() records of a new size holding this slab's records
  // up to high_water, all of them written) in place of the buffer.
  void AdoptWider(char* wider, size_t old_rec_bytes) {
    BigFree(data_, rows_ * old_rec_bytes);
    data_ = wider;
    faulted_rows_ = high_water_;
  }

  // After compaction moved every live row below `target`: the free rows are
  // [free_begin, free_end), high_water drops to `target` and the pages past it
  // go back to the OS.
  template <class It>
  void ShrinkTo(size_t target, It free_begin, It free_end, size_t rec_bytes) {
    free_rows_.assign(free_begin, free_end);
    free_rows_.shrink_to_fit();
    const size_t top = std::max<size_t>(faulted_rows_, high_water_);
    if (rows_ * rec_bytes >= kMmapMin) {
      ReleasePages(data_ + target * rec_bytes, (top - target) * rec_bytes);
    }
    high_water_ = static_cast<uint32_t>(target);
    faulted_rows_ = std::min(faulted_rows_, target);
  }

  // Frees the buffer and forgets every row (the caller destroyed the keys).
  void Free(size_t rec_bytes) {
    BigFree(data_, rows_ * rec_bytes);
    data_ = nullptr;
    rows_ = 0;
    high_water_ = 0;
    faulted_rows_ = 0;
    fault_ahead_ = 0;
    std::vector<uint32_t>().swap(free_rows_);
  }

  void Swap(RowSlab& other) {
    std::swap(data_, other.data_);
    std::swap(rows_, other.rows_);
    std::swap(high_water_, other.high_water_);
    std::swap(faulted_rows_, other.faulted_rows_);
    std::swap(fault_ahead_, other.fault_ahead_);
    free_rows_.swap(other.free_rows_);
  }

 private:
  // Faults in the pages of the next rows past high_water, in one call for up
  // to kFaultChunkBytes (within what PrepareNewRows allowed).
  void FaultAhead(size_t rec_bytes) {
    if (high_water_ < faulted_rows_ || fault_ahead_ == 0) return;
    const size_t chunk = std::max<size_t>(1, kFaultChunkBytes / rec_bytes);
    const size_t end = std::min<size_t>(rows_, high_water_ + std::min(fault_ahead_, chunk));
    if (end <= high_water_) return;
    Prefault(data_ + size_t{high_water_} * rec_bytes, (end - high_water_) * rec_bytes);
    fault_ahead_ -= std::min(fault_ahead_, end - high_water_);
    faulted_rows_ = end;
  }

  char* data_ = nullptr;
  size_t rows_ = 0;            // allocated rows
  uint32_t high_water_ = 0;    // rows ever handed out
  size_t faulted_rows_ = 0;    // rows [0, faulted_rows_) have their pages faulted in
  size_t fault_ahead_ = 0;     // new rows this batch may still fault in (PrepareNewRows)
  std::vector<uint32_t> free_rows_;
};

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_SLAB_H_

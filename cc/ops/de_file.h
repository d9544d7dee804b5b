// Streaming per-shard table files.
//
// Layout (all integers little-endian):
//   header  64 bytes: "TFRADETB" | u32 version | u32 key dtype | u32 value dtype
//                     | u32 0 | u64 dim | 28 zero bytes | u32 masked crc32c(bytes 0..60)
//   blocks  repeated: u32 "DBLK" | u32 rows | u64 payload bytes | payload
//                     | u32 masked crc32c(block header + payload)
//   footer  u32 "DEND" | u32 0 | u64 total rows | u32 masked crc32c(footer 0..16)
//   then end of file.
// Row in a payload: key (raw int32/int64, or u32 length + bytes) | u32 stamp |
// u32 freq | dim raw values. A file is written under a temporary name and
// renamed when complete, so readers never see a half-written file; a reader
// verifies every checksum and the row count before anything is applied.
#ifndef TFRA_DE_CC_OPS_DE_FILE_H_
#define TFRA_DE_CC_OPS_DE_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/file_system.h"

namespace tfra_de {

constexpr uint32_t kFileVersion = 1;
// A block holds about this many payload bytes (rows are never split).
constexpr size_t kBlockTargetBytes = size_t{1} << 20;
// Upper bound on one block's payload; larger claims mean a corrupt file.
constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 31;

struct FileHeader {
  uint32_t key_dtype = 0;
  uint32_t value_dtype = 0;
  uint64_t dim = 0;
};

class TableFileWriter {
 public:
  TableFileWriter() = default;
  ~TableFileWriter();  // removes the temporary file unless Finish succeeded
  absl::Status Open(const std::string& path, const FileHeader& header);
  absl::Status WriteBlock(uint32_t rows, const std::string& payload);
  absl::Status Finish(uint64_t total_rows);

 private:
  std::string path_, tmp_path_;
  std::unique_ptr<tsl::WritableFile> file_;
  bool done_ = false;
};

class TableFileReader {
 public:
  absl::Status Open(const std::string& path, FileHeader* header);
  // Reads the next block. At the footer sets *at_end and *total_rows, and
  // checks that nothing follows it.
  absl::Status NextBlock(uint32_t* rows, std::string* payload, bool* at_end,
                         uint64_t* total_rows);

 private:
  absl::Status ReadExact(size_t n, char* dst);
  std::string path_;
  std::unique_ptr<tsl::RandomAccessFile> file_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
};

// Little-endian appenders/readers used by the payload codecs.
inline void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
inline void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

}  // namespace tfra_de

#endif  // TFRA_DE_CC_OPS_DE_FILE_H_

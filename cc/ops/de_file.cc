#include "de_file.h"

#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/lib/hash/crc32c.h"
#include "tensorflow/core/platform/path.h"

namespace tfra_de {
namespace {

constexpr char kMagic[8] = {'T', 'F', 'R', 'A', 'D', 'E', 'T', 'B'};
constexpr uint32_t kBlockMagic = 0x4B4C4244;  // "DBLK"
constexpr uint32_t kEndMagic = 0x444E4544;    // "DEND"
constexpr size_t kHeaderBytes = 64;

uint32_t Crc(const char* p, size_t n, uint32_t init = 0) {
  return tsl::crc32c::Extend(init, p, n);
}
// Masked like TFRecord, so a crc stored next to its data does not checksum
// to a trivial pattern.
uint32_t Mask(uint32_t crc) { return tsl::crc32c::Mask(crc); }

uint32_t GetU32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string UniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(".tmp-", tsl::Env::Default()->NowMicros(), "-",
                      counter.fetch_add(1, std::memory_order_relaxed));
}

}  // namespace

TableFileWriter::~TableFileWriter() {
  if (!done_ && !tmp_path_.empty()) {
    if (file_) file_->Close().IgnoreError();
    tsl::Env::Default()->DeleteFile(tmp_path_).IgnoreError();
  }
}

absl::Status TableFileWriter::Open(const std::string& path, const FileHeader& header) {
  path_ = path;
  tmp_path_ = path + UniqueSuffix();
  tsl::Env* env = tsl::Env::Default();
  // A save may name a directory that does not exist yet (a new generation
  // directory of a multi-shard save, chosen when the op runs).
  const std::string dir(tsl::io::Dirname(path));
  if (!dir.empty() && !env->IsDirectory(dir).ok()) {
    absl::Status made = env->RecursivelyCreateDir(dir);
    if (!made.ok() && !absl::IsAlreadyExists(made)) {
      tmp_path_.clear();
      return absl::Status(made.code(), absl::StrCat("save_to_file: cannot create directory '",
                                                    dir, "': ", made.message()));
    }
  }
  absl::Status st = env->NewWritableFile(tmp_path_, &file_);
  if (!st.ok()) {
    std::string tmp = tmp_path_;
    tmp_path_.clear();
    return absl::Status(st.code(), absl::StrCat("save_to_file: cannot create '", tmp, "': ",
                                                st.message()));
  }
  std::string h(kHeaderBytes, '\0');
  std::memcpy(&h[0], kMagic, 8);
  std::memcpy(&h[8], &kFileVersion, 4);
  std::memcpy(&h[12], &header.key_dtype, 4);
  std::memcpy(&h[16], &header.value_dtype, 4);
  std::memcpy(&h[24], &header.dim, 8);
  uint32_t crc = Mask(Crc(h.data(), 60));
  std::memcpy(&h[60], &crc, 4);
  return file_->Append(h);
}

absl::Status TableFileWriter::WriteBlock(uint32_t rows, const std::string& payload) {
  char head[16];
  std::memcpy(head, &kBlockMagic, 4);
  std::memcpy(head + 4, &rows, 4);
  uint64_t n = payload.size();
  std::memcpy(head + 8, &n, 8);
  uint32_t crc = Mask(Crc(payload.data(), payload.size(), Crc(head, 16)));
  TF_RETURN_IF_ERROR(file_->Append(absl::string_view(head, 16)));
  TF_RETURN_IF_ERROR(file_->Append(payload));
  return file_->Append(absl::string_view(reinterpret_cast<const char*>(&crc), 4));
}

absl::Status TableFileWriter::Finish(uint64_t total_rows) {
  char foot[20];
  uint32_t zero = 0;
  std::memcpy(foot, &kEndMagic, 4);
  std::memcpy(foot + 4, &zero, 4);
  std::memcpy(foot + 8, &total_rows, 8);
  uint32_t crc = Mask(Crc(foot, 16));
  std::memcpy(foot + 16, &crc, 4);
  TF_RETURN_IF_ERROR(file_->Append(absl::string_view(foot, 20)));
  // On disk before it is renamed into place (and before a commit record can
  // point at it), so a power loss cannot leave a named but empty file.
  TF_RETURN_IF_ERROR(file_->Sync());
  TF_RETURN_IF_ERROR(file_->Close());
  file_.reset();
  TF_RETURN_IF_ERROR(tsl::Env::Default()->RenameFile(tmp_path_, path_));
  done_ = true;
  return absl::OkStatus();
}

absl::Status TableFileReader::ReadExact(size_t n, char* dst) {
  if (n > size_ - offset_) {
    return absl::DataLossError(absl::StrCat("load_from_file: '", path_, "' is truncated at byte ",
                                            offset_, " (needed ", n, " more bytes, file has ",
                                            size_, ")"));
  }
  size_t done = 0;
  while (done < n) {
    absl::string_view got;
    absl::Status st = file_->Read(offset_ + done, n - done, &got, dst + done);
    if (got.empty()) {
      return absl::DataLossError(absl::StrCat("load_from_file: short read of '", path_,
                                              "' at byte ", offset_ + done, ": ", st.message()));
    }
    if (got.data() != dst + done) std::memmove(dst + done, got.data(), got.size());
    done += got.size();
    if (!st.ok() && !absl::IsOutOfRange(st)) return st;
  }
  offset_ += n;
  return absl::OkStatus();
}

absl::Status TableFileReader::Open(const std::string& path, FileHeader* header) {
  path_ = path;
  tsl::Env* env = tsl::Env::Default();
  absl::Status st = env->GetFileSize(path, &size_);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("load_from_file: cannot open '", path, "': ", st.message()));
  }
  TF_RETURN_IF_ERROR(env->NewRandomAccessFile(path, &file_));
  char h[kHeaderBytes];
  if (size_ < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat("load_from_file: '", path, "' is ", size_,
                                            " bytes, too short for a table file header"));
  }
  TF_RETURN_IF_ERROR(ReadExact(kHeaderBytes, h));
  if (std::memcmp(h, kMagic, 8) != 0) {
    return absl::DataLossError(absl::StrCat("load_from_file: '", path,
                                            "' is not a tfra_dynamic_embedding table file (bad magic)"));
  }
  if (Mask(Crc(h, 60)) != GetU32(h + 60)) {
    return absl::DataLossError(absl::StrCat("load_from_file: header checksum mismatch in '", path, "'"));
  }
  uint32_t version = GetU32(h + 8);
  if (version != kFileVersion) {
    return absl::InvalidArgumentError(absl::StrCat("load_from_file: '", path, "' has format version ",
                                                   version, "; this build reads version ", kFileVersion));
  }
  header->key_dtype = GetU32(h + 12);
  header->value_dtype = GetU32(h + 16);
  header->dim = GetU64(h + 24);
  return absl::OkStatus();
}

absl::Status TableFileReader::NextBlock(uint32_t* rows, std::string* payload, bool* at_end,
                                        uint64_t* total_rows) {
  char head[16];
  TF_RETURN_IF_ERROR(ReadExact(16, head));
  const uint32_t magic = GetU32(head);
  if (magic == kEndMagic) {
    char crc_bytes[4];
    TF_RETURN_IF_ERROR(ReadExact(4, crc_bytes));
    if (Mask(Crc(head, 16)) != GetU32(crc_bytes)) {
      return absl::DataLossError(absl::StrCat("load_from_file: footer checksum mismatch in '", path_, "'"));
    }
    if (offset_ != size_) {
      return absl::DataLossError(absl::StrCat("load_from_file: ", size_ - offset_,
                                              " unexpected bytes after the footer of '", path_, "'"));
    }
    *at_end = true;
    *total_rows = GetU64(head + 8);
    return absl::OkStatus();
  }
  if (magic != kBlockMagic) {
    return absl::DataLossError(absl::StrCat("load_from_file: bad block marker at byte ", offset_ - 16,
                                            " of '", path_, "'"));
  }
  *at_end = false;
  *rows = GetU32(head + 4);
  const uint64_t n = GetU64(head + 8);
  // Check the claimed size against the file before allocating for it.
  if (n > kMaxBlockBytes || n + 4 > size_ - offset_) {
    return absl::DataLossError(absl::StrCat("load_from_file: block at byte ", offset_ - 16, " of '",
                                            path_, "' claims ", n, " bytes; file is truncated or corrupt"));
  }
  payload->resize(n);
  TF_RETURN_IF_ERROR(ReadExact(n, payload->empty() ? nullptr : &(*payload)[0]));
  char crc_bytes[4];
  TF_RETURN_IF_ERROR(ReadExact(4, crc_bytes));
  if (Mask(Crc(payload->data(), payload->size(), Crc(head, 16))) != GetU32(crc_bytes)) {
    return absl::DataLossError(absl::StrCat("load_from_file: checksum mismatch in block at byte ",
                                            offset_ - n - 20, " of '", path_, "'"));
  }
  return absl::OkStatus();
}

}  // namespace tfra_de

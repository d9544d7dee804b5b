// TfraDeCommitSave: makes a multi-shard save visible all at once.
//
// A de.Variable writes the files of one save into a fresh generation
// directory `<dir>/<stem>.gen-<id>/`, then this op points the commit record
// `<dir>/<stem>.commit` at it: the record is written under a temporary name
// and renamed over the old one, so a reader sees the previous save or this
// one, never a mix. TensorFlow has no rename op, hence this kernel.
//
// After the rename it deletes, in `<dir>`, the generation directories of the
// same stem other than the new and the previously committed one (a reader that
// resolved the previous record may still be reading it), and temporary
// records left by interrupted commits. Cleanup failures are logged, never
// returned: the save is committed by then.
#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/platform/path.h"
#include "tensorflow/core/platform/random.h"

namespace tfra_de {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShapeUtils;

constexpr absl::string_view kRecordSuffix = ".commit";
constexpr absl::string_view kGenerationMark = ".gen-";
constexpr absl::string_view kTmpMark = ".tmp-";

// A single path component: non-empty, no separator, not "." or "..".
absl::Status CheckName(const char* arg, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(arg, " must be a plain file name (no '/', not '.' or '..'); got '", name,
                     "'"));
  }
  return absl::OkStatus();
}

absl::Status ScalarString(OpKernelContext* ctx, int index, const char* arg, std::string* out) {
  const Tensor& t = ctx->input(index);
  if (!TensorShapeUtils::IsScalar(t.shape())) {
    return absl::InvalidArgumentError(
        absl::StrCat(arg, " must be a scalar string, got shape ", t.shape().DebugString()));
  }
  *out = std::string(t.scalar<tensorflow::tstring>()());
  return absl::OkStatus();
}

std::string FirstLine(const std::string& s) {
  const size_t end = s.find_first_of("\r\n");
  return end == std::string::npos ? s : s.substr(0, end);
}

absl::Status WriteRecord(tsl::Env* env, const std::string& path, const std::string& content) {
  std::unique_ptr<tsl::WritableFile> file;
  TF_RETURN_IF_ERROR(env->NewWritableFile(path, &file));
  TF_RETURN_IF_ERROR(file->Append(content));
  // Synced before the rename so the record never points at nothing after a
  // power loss (the shard files are synced by their writers).
  TF_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

absl::Status CommitSave(tsl::Env* env, const std::string& dir, const std::string& record,
                        const std::string& generation, const std::vector<std::string>& expected) {
  const std::string stem = record.substr(0, record.size() - kRecordSuffix.size());
  const std::string gen_dir = tsl::io::JoinPath(dir, generation);
  for (const std::string& name : expected) {
    const std::string path = tsl::io::JoinPath(gen_dir, name);
    absl::Status st = env->FileExists(path);
    if (!st.ok()) {
      return absl::NotFoundError(absl::StrCat("commit_save: '", path,
                                              "' is missing, so the save of '", stem,
                                              "' was not committed: ", st.message()));
    }
  }
  const std::string record_path = tsl::io::JoinPath(dir, record);
  std::string previous;
  if (env->FileExists(record_path).ok()) {
    std::string content;
    if (tsl::ReadFileToString(env, record_path, &content).ok()) previous = FirstLine(content);
  }
  const std::string tmp =
      absl::StrCat(record_path, kTmpMark, env->NowMicros(), "-", tsl::random::New64());
  absl::Status st = WriteRecord(env, tmp, generation + "\n");
  if (st.ok()) st = env->RenameFile(tmp, record_path);
  if (!st.ok()) {
    env->DeleteFile(tmp).IgnoreError();
    return absl::Status(st.code(), absl::StrCat("commit_save: cannot write commit record '",
                                                record_path, "': ", st.message()));
  }

  std::vector<std::string> children;
  absl::Status listed = env->GetChildren(dir, &children);
  if (!listed.ok()) {
    LOG(WARNING) << "commit_save: cannot list '" << dir << "' to remove old generations: "
                 << listed.message();
    return absl::OkStatus();
  }
  const std::string gen_prefix = absl::StrCat(stem, kGenerationMark);
  const std::string tmp_prefix = absl::StrCat(record, kTmpMark);
  for (const std::string& child : children) {
    if (child == generation || child == previous) continue;
    const std::string path = tsl::io::JoinPath(dir, child);
    if (absl::StartsWith(child, gen_prefix)) {
      int64_t undeleted_files = 0, undeleted_dirs = 0;
      absl::Status removed = env->DeleteRecursively(path, &undeleted_files, &undeleted_dirs);
      if (!removed.ok()) {
        LOG(WARNING) << "commit_save: cannot remove old generation '" << path
                     << "': " << removed.message();
      }
    } else if (absl::StartsWith(child, tmp_prefix)) {
      env->DeleteFile(path).IgnoreError();
    }
  }
  return absl::OkStatus();
}

class CommitSaveOp : public OpKernel {
 public:
  explicit CommitSaveOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    try {
      Run(ctx);
    } catch (const std::bad_alloc&) {
      ctx->CtxFailure(__FILE__, __LINE__, absl::ResourceExhaustedError("out of memory in commit_save"));
    } catch (const std::exception& e) {
      ctx->CtxFailure(__FILE__, __LINE__, absl::InternalError(absl::StrCat("commit_save: ", e.what())));
    }
  }

 private:
  void Run(OpKernelContext* ctx) {
    std::string dir, record, generation;
    OP_REQUIRES_OK(ctx, ScalarString(ctx, 0, "dirpath", &dir));
    OP_REQUIRES_OK(ctx, ScalarString(ctx, 1, "record", &record));
    OP_REQUIRES_OK(ctx, ScalarString(ctx, 2, "generation", &generation));
    OP_REQUIRES(ctx, !dir.empty(), absl::InvalidArgumentError("dirpath must not be empty"));
    OP_REQUIRES_OK(ctx, CheckName("record", record));
    OP_REQUIRES(ctx,
                record.size() > kRecordSuffix.size() && absl::EndsWith(record, kRecordSuffix),
                absl::InvalidArgumentError(absl::StrCat(
                    "record must be '<stem>", kRecordSuffix, "'; got '", record, "'")));
    OP_REQUIRES_OK(ctx, CheckName("generation", generation));
    const std::string gen_prefix =
        absl::StrCat(record.substr(0, record.size() - kRecordSuffix.size()), kGenerationMark);
    OP_REQUIRES(ctx,
                generation.size() > gen_prefix.size() && absl::StartsWith(generation, gen_prefix),
                absl::InvalidArgumentError(absl::StrCat("generation must be '", gen_prefix,
                                                        "<id>'; got '", generation, "'")));
    const Tensor& expected_t = ctx->input(3);
    OP_REQUIRES(ctx, TensorShapeUtils::IsVector(expected_t.shape()),
                absl::InvalidArgumentError(absl::StrCat("expected_files must be a 1-D string "
                                                        "tensor, got shape ",
                                                        expected_t.shape().DebugString())));
    std::vector<std::string> expected;
    const auto flat = expected_t.flat<tensorflow::tstring>();
    for (int64_t i = 0; i < flat.size(); ++i) {
      expected.emplace_back(flat(i));
      OP_REQUIRES_OK(ctx, CheckName("expected_files", expected.back()));
    }
    OP_REQUIRES_OK(ctx, CommitSave(ctx->env(), dir, record, generation, expected));
  }
};

REGISTER_OP("TfraDeCommitSave")
    .Input("dirpath: string")
    .Input("record: string")
    .Input("generation: string")
    .Input("expected_files: string")
    .SetIsStateful()
    .SetShapeFn(tensorflow::shape_inference::NoOutputs)
    .Doc("Commits a multi-shard save: checks that every expected file exists in "
         "<dirpath>/<generation>/, atomically points <dirpath>/<record> at the generation, then "
         "removes older generations of the same record (keeping the previously committed one) "
         "and leftover temporary records.");

REGISTER_KERNEL_BUILDER(Name("TfraDeCommitSave").Device(tensorflow::DEVICE_CPU), CommitSaveOp);

}  // namespace
}  // namespace tfra_de

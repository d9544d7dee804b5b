// Connections to a Redis server over hiredis: a bounded pool per server, and
// pipelined execution of a batch of commands on it. Every failure becomes a
// Status naming the server (host:port), and every wait is bounded by the
// configured timeouts: a dead or frozen server gives an error, never a hang.
//
// Only the Redis op library (_tfra_de_redis_ops.so) includes this header; the
// main op library never links hiredis.
#ifndef TFRA_DE_CC_REDIS_REDIS_CONN_H_
#define TFRA_DE_CC_REDIS_REDIS_CONN_H_

#include <hiredis/hiredis.h>
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tfra_de {
namespace redis {

using Status = absl::Status;

// Where one server is and how to talk to it (fields of TFRA's config file).
struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;       // "" or "default": AUTH <password> (Redis < 6 has no users)
  std::string password;   // "": no AUTH
  int db = 0;             // SELECT db after connecting (standalone only)
  int connect_timeout_ms = 1000;
  int socket_timeout_ms = 1000;
  int pool_size = 20;
  int64_t wait_timeout_ms = 100000000;  // waiting for a free pooled connection
  bool keep_alive = false;
  bool cluster = false;   // a cluster node: no SELECT (clusters have db 0 only)

  std::string Name() const { return host + ":" + std::to_string(port); }
};

// Where the elements of an HMGET-like array reply go, parsed straight into a
// tensor: element j of the reply is the row of key idx[j] (rows + idx[j] *
// row_bytes; found[idx[j]] = true), a nil leaves it. The parser allocates no
// reply object per element (hiredis' default makes two per element). Set on a
// command (Command::sink); its reply then reaches on_reply as an array with
// `elements` and no `element` (Parsed(reply) says so).
struct RowSink {
  const int64_t* idx = nullptr;
  size_t n = 0;
  char* rows = nullptr;
  bool* found = nullptr;
  int64_t row_bytes = 0;
  // Set by the parser: the reply it parsed, and the first element that was no
  // row of row_bytes (its reply type and length; bad_len -1: none).
  const void* top = nullptr;
  int bad_type = 0;
  int64_t bad_len = -1;

  bool Parsed(const redisReply* r) const { return r == top && r->element == nullptr; }
};

// One command as argv. The pointers are not owned (they point into tensors or
// into `owned`) and must stay valid until the batch has run.
struct Command {
  std::vector<const char*> argv;
  std::vector<size_t> len;
  std::deque<std::string> owned;  // a deque: push_back never moves earlier strings
  int key_arg = 1;                // argv index of the Redis key (hash name): routing
  int lane = 0;                   // commands of one lane run in order on one connection
  RowSink* sink = nullptr;        // its array reply is parsed into a tensor (RowSink)

  void Add(const char* p, size_t n) {
    argv.push_back(p);
    len.push_back(n);
  }
  void Add(const std::string& s) { Add(s.data(), s.size()); }
  void AddOwned(std::string s) {
    owned.push_back(std::move(s));
    Add(owned.back());
  }
  // The key (hash name) for messages: printable, other bytes as \xNN (an MD5 prefix).
  std::string Key() const;
  std::string Verb() const { return std::string(argv[0], len[0]); }
};

// One reply of command `index` of a batch; the reply is freed after the call.
using ReplyFn = std::function<Status(size_t index, const redisReply* reply)>;

// Blocks SIGPIPE in this thread while a socket is written: hiredis writes with
// write(2), and a server that closed the connection would otherwise kill a
// process that has not ignored SIGPIPE (Python ignores it; TF Serving may not).
class SigpipeGuard {
 public:
  SigpipeGuard();
  ~SigpipeGuard();
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  bool was_pending_ = false;
  sigset_t old_mask_;
};

struct ContextDeleter {
  void operator()(redisContext* c) const {
    if (c != nullptr) redisFree(c);
  }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

// Opens one connection: connect (bounded by connect_timeout_ms), socket
// timeouts, AUTH and SELECT. Errors name the server and the config field.
Status Connect(const ServerOptions& opt, Context* out);

// A bounded pool of connections to one server.
class Pool {
 public:
  explicit Pool(ServerOptions opt) : opt_(std::move(opt)) {}
  const ServerOptions& options() const { return opt_; }

  // Opens (and returns to the pool) one connection: wrong address, password
  // or db fail here, when the table is created.
  Status Check();

  // Sends cmds[order[0]], cmds[order[1]], ... pipelined on one connection and
  // calls on_reply for each reply in that order. Error replies are passed on
  // too (the caller decides); a lost connection is an Unavailable error.
  Status RunPipelined(const std::vector<Command>& cmds, const std::vector<size_t>& order,
                      const ReplyFn& on_reply);

 private:
  Status Acquire(Context* out);
  void Release(Context c, bool healthy);

  const ServerOptions opt_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Context> idle_;
  int open_ = 0;  // connections handed out or idle
};

// `bytes` for a message: printable ASCII as is, other bytes as \xNN (a hash name
// with TFRA's MD5 prefix is binary; TF's Python side needs UTF-8 messages).
std::string Printable(const char* p, size_t n);
inline std::string Printable(const std::string& s) { return Printable(s.data(), s.size()); }

// The error of an error reply, naming the server, the command and its key.
Status ReplyError(const std::string& server, const Command& cmd, const redisReply* reply);

// The value of the top-level string field `field` of a JSON file (TFRA's
// config), or "" when the file has no such field. The password is read here,
// in the kernel, so that it never appears in a graph or a SavedModel.
Status ReadJsonStringField(const std::string& path, const std::string& field, std::string* out);

// Every top-level field of a JSON file (TFRA's config) as the raw JSON text of
// its value; JsonField decodes one (a missing field leaves *out as it is; a
// value of another JSON type is an error naming the file and the field).
Status ReadJsonObject(const std::string& path, std::map<std::string, std::string>* fields);
Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::string* out);
Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, int64_t* out);
Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, bool* out);
Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::vector<std::string>* out);
Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::vector<int64_t>* out);

}  // namespace redis
}  // namespace tfra_de

#endif  // TFRA_DE_CC_REDIS_REDIS_CONN_H_

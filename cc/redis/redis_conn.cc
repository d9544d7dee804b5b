#include "cc/redis/redis_conn.h"

#include <errno.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tfra_de {
namespace redis {

#define TF_RETURN_IF_ERROR_REDIS(expr) \
  do {                                 \
    Status _s = (expr);                \
    if (!_s.ok()) return _s;           \
  } while (0)

namespace {

timeval Millis(int ms) {
  // 0 in TFRA's config would make hiredis give up at once on every connect or
  // read; it is taken as TFRA's default (1 s) instead.
  if (ms <= 0) ms = 1000;
  timeval tv;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  return tv;
}

// A pipelined window: at most this many commands / bytes are written before
// their replies are read, so a huge batch never buffers all of itself twice.
// A small byte window also keeps the server's query buffer small: Redis moves
// what is left of it after each read, so a backlog of many MB costs the
// server's thread CPU per key (measured, HSET of dim-64 rows on redis 7.0:
// ~0.40 us/key with 1 MB in flight, ~0.50 with 32 MB).
constexpr size_t kWindowCommands = 256;
constexpr size_t kWindowBytes = 1u << 20;

// Runs one command on a fresh connection (AUTH, SELECT, PING).
Status Simple(redisContext* c, const ServerOptions& opt, const std::vector<std::string>& args,
              const std::string& what, redisReply** out) {
  std::vector<const char*> argv;
  std::vector<size_t> len;
  for (const auto& a : args) {
    argv.push_back(a.data());
    len.push_back(a.size());
  }
  SigpipeGuard guard;
  void* r = redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), len.data());
  if (r == nullptr) {
    return absl::UnavailableError(absl::StrCat("Redis server ", opt.Name(), ": connection lost during ",
                                               what, ": ", c->errstr, " (redis_socket_timeout ",
                                               opt.socket_timeout_ms, " ms)"));
  }
  *out = static_cast<redisReply*>(r);
  return absl::OkStatus();
}

std::string ReplyText(const redisReply* r) {
  if (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS ||
      r->type == REDIS_REPLY_STRING) {
    return Printable(r->str, r->len);
  }
  return absl::StrCat("(reply type ", r->type, ")");
}

// -- replies parsed into tensors (RowSink) -------------------------------------
// hiredis' reader builds replies through a table of functions; these hand
// everything to hiredis' own (the table a fresh context has), except the
// elements of an array reply whose command has a sink: those are copied to
// their rows at once and stand for themselves by a placeholder. The sink of the
// reply being read is thread-local: a reply is parsed inside redisGetReply, on
// the thread that called it.
thread_local RowSink* tls_sink = nullptr;
redisReplyObjectFunctions* g_default_fns = nullptr;  // hiredis' own (set once, by Connect)
char g_placeholder;                                    // a sink array's element

bool SinkChild(const redisReadTask* t) {
  if (t->parent == nullptr) return false;
  if (t->parent->obj == &g_placeholder) return true;  // (nested: never in an HMGET reply)
  return tls_sink != nullptr && tls_sink->top != nullptr && t->parent->obj == tls_sink->top;
}

void SinkBad(int type, int64_t len) {
  if (tls_sink->bad_len < 0) {
    tls_sink->bad_type = type;
    tls_sink->bad_len = len;
  }
}

void* SinkString(const redisReadTask* t, char* str, size_t len) {
  if (!SinkChild(t)) return g_default_fns->createString(t, str, len);
  RowSink* s = tls_sink;
  if (t->type == REDIS_REPLY_STRING && static_cast<int64_t>(len) == s->row_bytes && t->idx >= 0 &&
      static_cast<size_t>(t->idx) < s->n) {
    const int64_t row = s->idx[t->idx];
    std::memcpy(s->rows + row * s->row_bytes, str, len);
    s->found[row] = true;
  } else {
    SinkBad(t->type, static_cast<int64_t>(len));
  }
  return &g_placeholder;
}

void* SinkArray(const redisReadTask* t, int elements) {
  if (tls_sink != nullptr && t->parent == nullptr) {
    // calloc'd as hiredis' own, with no element array: freeReplyObject frees it.
    redisReply* r = static_cast<redisReply*>(std::calloc(1, sizeof(redisReply)));
    if (r == nullptr) return nullptr;
    r->type = REDIS_REPLY_ARRAY;
    r->elements = elements < 0 ? 0 : static_cast<size_t>(elements);
    tls_sink->top = r;
    tls_sink->bad_len = -1;
    return r;
  }
  if (!SinkChild(t)) return g_default_fns->createArray(t, elements);
  SinkBad(REDIS_REPLY_ARRAY, 0);
  return &g_placeholder;
}

void* SinkInteger(const redisReadTask* t, long long value) {  // NOLINT(runtime/int): hiredis'
  if (!SinkChild(t)) return g_default_fns->createInteger(t, value);
  SinkBad(REDIS_REPLY_INTEGER, 0);
  return &g_placeholder;
}

void* SinkNil(const redisReadTask* t) {
  if (!SinkChild(t)) return g_default_fns->createNil(t);
  return &g_placeholder;
}

void SinkFree(void* obj) {
  if (obj != &g_placeholder) g_default_fns->freeObject(obj);
}

redisReplyObjectFunctions g_sink_fns = {SinkString, SinkArray, SinkInteger, SinkNil, SinkFree};

void InstallSinkFunctions(redisContext* c) {
  static std::once_flag once;
  std::call_once(once, [c] { g_default_fns = c->reader->fn; });
  if (c->reader->fn == g_default_fns) c->reader->fn = &g_sink_fns;
}

}  // namespace

SigpipeGuard::SigpipeGuard() {
  sigset_t pending, pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe, &old_mask_);
}

SigpipeGuard::~SigpipeGuard() {
  sigset_t pending, pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  sigemptyset(&pending);
  sigpending(&pending);
  if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
    // Our write raised it: consume it before unblocking, so it is never delivered.
    timespec zero{0, 0};
    sigtimedwait(&pipe, nullptr, &zero);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
}

Status Connect(const ServerOptions& opt, Context* out) {
  Context c(redisConnectWithTimeout(opt.host.c_str(), opt.port, Millis(opt.connect_timeout_ms)));
  if (!c) return absl::ResourceExhaustedError("cannot allocate a Redis connection");
  if (c->err) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to the Redis server ", opt.Name(), ": ", c->errstr,
        " (redis_host_ip / redis_host_port; redis_connect_timeout ", opt.connect_timeout_ms, " ms)"));
  }
  if (redisSetTimeout(c.get(), Millis(opt.socket_timeout_ms)) != REDIS_OK) {
    return absl::UnavailableError(absl::StrCat("Redis server ", opt.Name(),
                                               ": cannot set the socket timeout: ", c->errstr));
  }
  if (opt.keep_alive) redisEnableKeepAlive(c.get());
  InstallSinkFunctions(c.get());
  redisReply* r = nullptr;
  if (!opt.password.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!opt.user.empty() && opt.user != "default") auth.push_back(opt.user);
    auth.push_back(opt.password);
    Status s = Simple(c.get(), opt, auth, "AUTH", &r);
    if (!s.ok()) return s;
    const bool bad = r->type == REDIS_REPLY_ERROR;
    const std::string text = ReplyText(r);
    freeReplyObject(r);
    if (bad) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the Redis server ", opt.Name(), " refused the password of user '",
          opt.user.empty() ? "default" : opt.user, "' (redis_user / redis_password): ", text));
    }
  }
  if (opt.db != 0 && !opt.cluster) {
    Status s = Simple(c.get(), opt, {"SELECT", std::to_string(opt.db)}, "SELECT", &r);
    if (!s.ok()) return s;
    const bool bad = r->type == REDIS_REPLY_ERROR;
    const std::string text = ReplyText(r);
    freeReplyObject(r);
    if (bad) {
      return absl::InvalidArgumentError(absl::StrCat("the Redis server ", opt.Name(),
                                                     " cannot select redis_db ", opt.db, ": ", text));
    }
  }
  // A server that wants a password we did not give answers PING with NOAUTH.
  Status s = Simple(c.get(), opt, {"PING"}, "PING", &r);
  if (!s.ok()) return s;
  const bool bad = r->type == REDIS_REPLY_ERROR;
  const std::string text = ReplyText(r);
  freeReplyObject(r);
  if (bad) {
    return absl::PermissionDeniedError(absl::StrCat("the Redis server ", opt.Name(),
                                                    " refused PING (redis_password?): ", text));
  }
  *out = std::move(c);
  return absl::OkStatus();
}

Status Pool::Check() {
  Context c;
  Status s = Acquire(&c);
  if (s.ok()) Release(std::move(c), true);
  return s;
}

Status Pool::Acquire(Context* out) {
  {
    std::unique_lock<std::mutex> l(mu_);
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(std::max<int64_t>(opt_.wait_timeout_ms, 1));
    while (idle_.empty() && open_ >= std::max(opt_.pool_size, 1)) {
      if (cv_.wait_until(l, deadline) == std::cv_status::timeout && idle_.empty() &&
          open_ >= std::max(opt_.pool_size, 1)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "Redis server ", opt_.Name(), ": all ", opt_.pool_size, " pooled connections stayed busy for ",
            opt_.wait_timeout_ms, " ms (redis_conn_pool_size / redis_wait_timeout)"));
      }
    }
    if (!idle_.empty()) {
      *out = std::move(idle_.back());
      idle_.pop_back();
    } else {
      ++open_;
    }
  }
  if (*out) {
    // An idle connection whose server closed it (a restart, an idle timeout)
    // reads as end-of-file without blocking: replace it rather than fail the
    // op that happens to draw it.
    char probe;
    const ssize_t got = recv((*out)->fd, &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got == 0 || got > 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      out->reset();
    } else {
      return absl::OkStatus();
    }
  }
  Status s = Connect(opt_, out);
  if (!s.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    --open_;
    cv_.notify_one();
  }
  return s;
}

void Pool::Release(Context c, bool healthy) {
  std::lock_guard<std::mutex> l(mu_);
  if (healthy && c) {
    idle_.push_back(std::move(c));
  } else {
    --open_;  // a broken connection is dropped; the next Acquire reconnects
  }
  cv_.notify_one();
}

Status Pool::RunPipelined(const std::vector<Command>& cmds, const std::vector<size_t>& order,
                          const ReplyFn& on_reply) {
  if (order.empty()) return absl::OkStatus();
  Context c;
  Status s = Acquire(&c);
  if (!s.ok()) return s;
  SigpipeGuard guard;
  Status first_error;
  bool broken = false;
  size_t sent = 0, received = 0;
  while (received < order.size() && !broken) {
    size_t bytes = 0;
    while (sent < order.size() && sent - received < kWindowCommands && bytes < kWindowBytes) {
      const Command& cmd = cmds[order[sent]];
      if (redisAppendCommandArgv(c.get(), static_cast<int>(cmd.argv.size()),
                                 const_cast<const char**>(cmd.argv.data()), cmd.len.data()) != REDIS_OK) {
        first_error = absl::ResourceExhaustedError(
            absl::StrCat("Redis server ", opt_.Name(), ": cannot buffer ", cmd.Verb(), " on '",
                         cmd.Key(), "': ", c->errstr));
        broken = true;  // the output buffer is in an unknown state
        break;
      }
      for (size_t n : cmd.len) bytes += n;
      ++sent;
    }
    while (received < sent && !broken) {
      void* raw = nullptr;
      tls_sink = cmds[order[received]].sink;
      const int got = redisGetReply(c.get(), &raw);
      tls_sink = nullptr;
      if (got != REDIS_OK || raw == nullptr) {
        const Command& cmd = cmds[order[received]];
        first_error = absl::UnavailableError(absl::StrCat(
            "Redis server ", opt_.Name(), ": connection lost during ", cmd.Verb(), " on '", cmd.Key(),
            "': ", c->errstr[0] ? c->errstr : "no reply",
            " (redis_socket_timeout ", opt_.socket_timeout_ms, " ms)"));
        broken = true;
        break;
      }
      redisReply* reply = static_cast<redisReply*>(raw);
      Status r = on_reply(order[received], reply);
      freeReplyObject(reply);
      if (!r.ok() && first_error.ok()) first_error = r;
      ++received;
    }
  }
  Release(std::move(c), !broken);
  return first_error;
}

std::string Command::Key() const { return Printable(argv[key_arg], len[key_arg]); }

std::string Printable(const char* bytes, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
      out.push_back(static_cast<char>(p[i]));
    } else {
      out += "\\x";
      out.push_back(kHex[p[i] >> 4]);
      out.push_back(kHex[p[i] & 15]);
    }
  }
  return out;
}

Status ReplyError(const std::string& server, const Command& cmd, const redisReply* reply) {
  std::string key = cmd.Key();
  return absl::FailedPreconditionError(absl::StrCat("Redis server ", server, " answered ", cmd.Verb(),
                                                    " on '", key, "' with an error: ",
                                                    ReplyText(reply)));
}

namespace {

// Minimal JSON reading: enough to walk a top-level object and decode strings.
class JsonScanner {
 public:
  explicit JsonScanner(const std::string& s) : s_(s) {}
  void Space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t')) ++i_;
  }
  bool Eat(char c) {
    Space();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    Space();
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    out->clear();
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': out->push_back(e); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && i_ + 1 < s_.size() && s_[i_] == '\\' && s_[i_ + 1] == 'u') {
            i_ += 2;
            uint32_t lo;
            if (!Hex4(&lo)) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          Utf8(cp, out);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  size_t Pos() {
    Space();
    return i_;
  }
  bool AtEnd() {
    Space();
    return i_ >= s_.size();
  }
  // Skips any JSON value (numbers, literals, arrays, objects, strings).
  bool Skip() {
    Space();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '"') {
      std::string unused;
      return String(&unused);
    }
    if (c == '[' || c == '{') {
      const char close = c == '[' ? ']' : '}';
      ++i_;
      if (Eat(close)) return true;
      while (true) {
        if (c == '{') {
          std::string k;
          if (!String(&k) || !Eat(':')) return false;
        }
        if (!Skip()) return false;
        if (Eat(close)) return true;
        if (!Eat(',')) return false;
      }
    }
    while (i_ < s_.size() && s_[i_] != ',' && s_[i_] != '}' && s_[i_] != ']' && s_[i_] != ' ' &&
           s_[i_] != '\n' && s_[i_] != '\r' && s_[i_] != '\t') {
      ++i_;
    }
    return true;
  }

 private:
  bool Hex4(uint32_t* v) {
    if (i_ + 4 > s_.size()) return false;
    *v = 0;
    for (int k = 0; k < 4; ++k) {
      char h = s_[i_++];
      *v <<= 4;
      if (h >= '0' && h <= '9') *v |= h - '0';
      else if (h >= 'a' && h <= 'f') *v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') *v |= h - 'A' + 10;
      else return false;
    }
    return true;
  }
  static void Utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  const std::string& s_;
  size_t i_ = 0;
};

}  // namespace

Status ReadJsonObject(const std::string& path, std::map<std::string, std::string>* fields) {
  fields->clear();
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read the Redis config file '", path, "'"));
  std::stringstream buf;
  buf << f.rdbuf();
  const std::string text = buf.str();
  JsonScanner js(text);
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat("the Redis config file '", path, "' is not a JSON object"));
  };
  if (!js.Eat('{')) return bad();
  if (js.Eat('}')) return absl::OkStatus();
  while (true) {
    std::string name;
    if (!js.String(&name) || !js.Eat(':')) return bad();
    const size_t from = js.Pos();
    if (!js.Skip()) return bad();
    (*fields)[name] = text.substr(from, js.Pos() - from);
    if (js.Eat('}')) return absl::OkStatus();
    if (!js.Eat(',')) return bad();
  }
}

namespace {

Status BadField(const std::string& path, const std::string& field, const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("the Redis config file '", path, "': ", field, " must be ", what));
}

bool ParseInt(const std::string& raw, int64_t* out) {
  if (raw.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(raw.c_str(), &end, 10);  // NOLINT(runtime/int)
  if (errno != 0 || end == raw.c_str()) return false;
  while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t') ++end;
  if (*end != '\0') return false;
  *out = v;
  return true;
}

// The items of a JSON array (raw text of each), or false.
bool ArrayItems(const std::string& raw, std::vector<std::string>* items) {
  items->clear();
  JsonScanner js(raw);
  if (!js.Eat('[')) return false;
  if (js.Eat(']')) return js.AtEnd();
  while (true) {
    const size_t from = js.Pos();
    if (!js.Skip()) return false;
    items->push_back(raw.substr(from, js.Pos() - from));
    if (js.Eat(']')) return js.AtEnd();
    if (!js.Eat(',')) return false;
  }
}

}  // namespace

Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::string* out) {
  auto it = fields.find(field);
  if (it == fields.end()) return absl::OkStatus();
  JsonScanner js(it->second);
  if (!js.String(out) || !js.AtEnd()) return BadField(path, field, "a JSON string");
  return absl::OkStatus();
}

Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, int64_t* out) {
  auto it = fields.find(field);
  if (it == fields.end()) return absl::OkStatus();
  if (!ParseInt(it->second, out)) return BadField(path, field, "a JSON integer");
  return absl::OkStatus();
}

Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, bool* out) {
  auto it = fields.find(field);
  if (it == fields.end()) return absl::OkStatus();
  if (it->second == "true" || it->second == "false") {
    *out = it->second == "true";
    return absl::OkStatus();
  }
  return BadField(path, field, "a JSON boolean");
}

Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::vector<std::string>* out) {
  auto it = fields.find(field);
  if (it == fields.end()) return absl::OkStatus();
  std::vector<std::string> items;
  if (!ArrayItems(it->second, &items)) return BadField(path, field, "a JSON array of strings");
  out->clear();
  for (const auto& item : items) {
    JsonScanner js(item);
    std::string v;
    if (!js.String(&v) || !js.AtEnd()) return BadField(path, field, "a JSON array of strings");
    out->push_back(v);
  }
  return absl::OkStatus();
}

Status JsonField(const std::map<std::string, std::string>& fields, const std::string& path,
                 const std::string& field, std::vector<int64_t>* out) {
  auto it = fields.find(field);
  if (it == fields.end()) return absl::OkStatus();
  std::vector<std::string> items;
  if (!ArrayItems(it->second, &items)) return BadField(path, field, "a JSON array of integers");
  out->clear();
  for (const auto& item : items) {
    int64_t v;
    if (!ParseInt(item, &v)) return BadField(path, field, "a JSON array of integers");
    out->push_back(v);
  }
  return absl::OkStatus();
}

Status ReadJsonStringField(const std::string& path, const std::string& field, std::string* out) {
  out->clear();
  std::map<std::string, std::string> fields;
  TF_RETURN_IF_ERROR_REDIS(ReadJsonObject(path, &fields));
  return JsonField(fields, path, field, out);
}

}  // namespace redis
}  // namespace tfra_de

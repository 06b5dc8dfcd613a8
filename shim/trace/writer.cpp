// The trace writer thread (see writer.h).
#include "trace/writer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "os/private_file.h"
#include "os/thread.h"

namespace allocshim::trace {
namespace {
// Chunks of about this much raw data compress well (zstd needs context) and bound what an abrupt
// exit loses to one flush interval.
constexpr std::size_t kChunkTarget = 1 << 20;
// Buffers queued but not yet written, beyond which threads drop records rather than wait.
constexpr std::size_t kMaxInFlight = 256u << 20;
constexpr std::size_t kMaxFreeBuffers = 64;
}  // namespace

Writer::~Writer() {
  if (running_) stop();
  if (fd_ >= 0) ::close(fd_);
}

bool Writer::open(const std::string& path, const FileHeader& header, std::string& error) {
  os::PrivateFile f = os::create_private(path);
  if (f.fd < 0) {
    error = "cannot create the trace file " + f.error;
    return false;
  }
  // Traces hold addresses and code locations of the program: a mode that cannot be made private
  // is worth a line.
  if (!f.error.empty()) {
    char msg[512];
    std::snprintf(msg, sizeof msg, "allocshim: trace %s\n", f.error.c_str());
    [[maybe_unused]] ssize_t ignored = ::write(2, msg, std::strlen(msg));
  }
  fd_ = f.fd;
  path_ = path;
  unsigned char h[kFileHeaderBytes];
  encode_file_header(header, h);
  write_all(h, sizeof h);
  if (failed_) {
    error = "cannot write trace file " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

void Writer::start(Collect collect, std::uint32_t flush_ms) {
  collect_ = std::move(collect);
  flush_ms_ = flush_ms ? flush_ms : 200;
  running_ = true;
  thread_ = os::start_thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "allocshim-trace");
}

bool Writer::submit(std::unique_ptr<Buffer>& buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (queued_bytes_ + buffer->used > kMaxInFlight || !running_) return false;
  queued_bytes_ += buffer->used;
  queue_.push_back(std::move(buffer));
  if (queued_bytes_ >= kChunkTarget) wake_.notify_one();
  return true;
}

std::unique_ptr<Buffer> Writer::take_empty() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      std::unique_ptr<Buffer> b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  return std::make_unique<Buffer>(kThreadBufferBytes);
}

void Writer::flush() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!running_) return;
  const std::uint64_t ticket = ++flush_requested_;
  wake_.notify_one();
  done_.wait(lock, [&] { return flush_done_ >= ticket || !running_; });
}

void Writer::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!running_) return;
    stopping_ = true;
    ++flush_requested_;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Writer::run() {
  std::vector<std::unique_ptr<Buffer>> work;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait_for(lock, std::chrono::milliseconds(flush_ms_), [&] {
      return queued_bytes_ >= kChunkTarget || flush_requested_ > flush_done_ || stopping_;
    });
    const std::uint64_t ticket = flush_requested_;
    const bool last = stopping_;
    work.swap(queue_);
    queued_bytes_ = 0;
    lock.unlock();

    // Partial buffers are collected after the queue was taken, so a flush sees every record that
    // was appended before it was requested.
    collect_(work);
    write_buffers(work);

    lock.lock();
    for (auto& b : work) {
      if (b && b->capacity == kThreadBufferBytes && free_.size() < kMaxFreeBuffers) {
        b->used = 0;
        free_.push_back(std::move(b));
      }
    }
    work.clear();
    flush_done_ = ticket;
    done_.notify_all();
    if (last && queue_.empty()) break;
  }
  running_ = false;
  done_.notify_all();
}

void Writer::write_buffers(std::vector<std::unique_ptr<Buffer>>& buffers) {
  raw_.clear();
  auto emit = [&] {
    if (raw_.empty()) return;
    if (!failed_ && compressor_.compress(raw_.data(), raw_.size(), chunk_))
      write_all(chunk_.data(), chunk_.size());
    raw_.clear();
  };
  for (const auto& b : buffers) {
    if (!b || b->used == 0) continue;
    // Buffers hold whole records and each starts its own segment, so chunks may break between
    // any two of them.
    if (!raw_.empty() && raw_.size() + b->used > kChunkTarget) emit();
    if (b->used <= kChunkTarget) {
      raw_.insert(raw_.end(), b->data.get(), b->data.get() + b->used);
      continue;
    }
    // Only definitions (no segments) outgrow a thread's buffer: they split between any two records,
    // which keeps every chunk within what a reader accepts (kMaxChunkRaw).
    const unsigned char* p = b->data.get();
    const unsigned char* end = p + b->used;
    while (p < end) {
      const std::size_t n = record_size(p, static_cast<std::size_t>(end - p));
      if (n == 0) break;  // never: the recorder encodes whole records
      if (!raw_.empty() && raw_.size() + n > kChunkTarget) emit();
      raw_.insert(raw_.end(), p, p + n);
      p += n;
    }
  }
  emit();
}

void Writer::write_all(const unsigned char* p, std::size_t n) {
  while (n > 0 && !failed_) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      failed_ = true;
      // Once, and without allocating: the program goes on, its trace stops here.
      char msg[512];
      std::snprintf(msg, sizeof msg, "allocshim: trace %s: write failed (%s); tracing stops\n",
                    path_.c_str(), std::strerror(errno));
      [[maybe_unused]] ssize_t ignored = ::write(2, msg, std::strlen(msg));
      return;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
    bytes_written_ += static_cast<std::uint64_t>(w);
  }
}

}  // namespace allocshim::trace

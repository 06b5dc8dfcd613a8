// The trace writer: a thread that takes filled record buffers, packs them into chunks, compresses
// them and appends them to the file. Allocating threads only ever hand over a buffer (a mutex held
// for a push) and never wait for disk or compression.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "trace/format.h"

namespace allocshim::trace {

struct Buffer {
  explicit Buffer(std::size_t cap) : data(new unsigned char[cap]), capacity(cap) {}
  std::unique_ptr<unsigned char[]> data;
  std::size_t used = 0;
  std::size_t capacity;
};
inline constexpr std::size_t kThreadBufferBytes = 64 << 10;

class Writer {
 public:
  // Hands the writer the buffers that are not full yet (threads' partial buffers, definitions), so
  // a quiet program still reaches the disk every flush interval.
  using Collect = std::function<void(std::vector<std::unique_ptr<Buffer>>& out)>;

  Writer() = default;
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Creates `path` afresh with mode 0600 (os::create_private: never through a symlink or into
  // another user's file) and writes the file header.
  bool open(const std::string& path, const FileHeader& header, std::string& error);
  void start(Collect collect, std::uint32_t flush_ms);

  // Queues a filled buffer. False (the buffer stays with the caller) when more than the in-flight
  // limit is queued: the writer is behind and the caller drops the records instead of waiting.
  bool submit(std::unique_ptr<Buffer>& buffer);
  // An empty buffer of kThreadBufferBytes, recycled when possible.
  std::unique_ptr<Buffer> take_empty();

  // Writes everything submitted or collectable before the call; returns when it is in the file.
  void flush();
  // Final flush, then the thread ends and the file is closed.
  void stop();

  // fork: hold the writer's lock across fork so the child never inherits it held.
  void lock_for_fork() { mutex_.lock(); }
  void unlock_after_fork() { mutex_.unlock(); }

  std::uint64_t bytes_written() const { return bytes_written_; }

 private:
  void run();
  void write_buffers(std::vector<std::unique_ptr<Buffer>>& buffers);
  void write_all(const unsigned char* p, std::size_t n);

  int fd_ = -1;
  std::string path_;
  Collect collect_;
  std::uint32_t flush_ms_ = 200;
  std::thread thread_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::unique_ptr<Buffer>> queue_;
  std::vector<std::unique_ptr<Buffer>> free_;
  std::size_t queued_bytes_ = 0;
  std::uint64_t flush_requested_ = 0, flush_done_ = 0;
  bool stopping_ = false;
  bool running_ = false;

  // Writer-thread state.
  ChunkCompressor compressor_;
  std::vector<unsigned char> raw_, chunk_;
  std::uint64_t bytes_written_ = 0;
  bool failed_ = false;
};

}  // namespace allocshim::trace

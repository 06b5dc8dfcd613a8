// Helpers shared by the tracing tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "policy/policy.h"
#include "trace/format.h"
#include "trace/recorder.h"

namespace allocshim::test {

// Appends a record to `e`: its tag, then each of `values` as a number (strings follow with str()).
template <class... V>
void record(trace::Encoder& e, trace::Tag tag, V... values) {
  e.tag(tag);
  (e.u(static_cast<std::uint64_t>(values)), ...);
}

// Files the tests name with temp_path() live in one directory per test process, removed with
// everything in it when that process exits (not when a forked child does).
class TempFiles {
 public:
  TempFiles() {
    std::string dir = testing::TempDir() + "allocshim_trace_XXXXXX";
    if (mkdtemp(dir.data())) dir_ = dir + "/";
  }
  ~TempFiles() {
    std::error_code ignored;
    if (getpid() == owner_ && !dir_.empty()) std::filesystem::remove_all(dir_, ignored);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  pid_t owner_ = getpid();
};

inline std::string temp_path(const std::string& name) {
  static TempFiles files;
  return files.dir() + name;
}

inline trace::Recorder* start_recorder(const std::string& path, trace::StackMode stacks,
                                       std::uint32_t sample = 1) {
  trace::Config c;
  c.path = path;
  c.stacks = stacks;
  c.sample = sample;
  std::string error;
  trace::Recorder* r = trace::Recorder::start(c, error);
  EXPECT_NE(r, nullptr) << error;
  return r;
}

inline void describe_two_backends(trace::Recorder* r) {
  r->describe_backend(0, BackendKind::native, "native");
  r->describe_backend(1, BackendKind::async_pool, "pool");
}

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Start offsets of a trace file's chunks, up to the first header that does not decode.
inline std::vector<std::size_t> chunk_offsets(const std::vector<unsigned char>& b) {
  using namespace trace;
  std::vector<std::size_t> out;
  for (std::size_t pos = kFileHeaderBytes; pos + kChunkHeaderBytes <= b.size();) {
    ChunkHeader h;
    std::string e;
    if (!decode_chunk_header(b.data() + pos, h, e)) break;
    out.push_back(pos);
    pos += kChunkHeaderBytes + h.compressed;
  }
  return out;
}

}  // namespace allocshim::test

// Every tracing test writes with the shim's recorder and reads with the tool's reader.
namespace allocshim::analysis {}
using namespace allocshim::trace;
using namespace allocshim::analysis;
using allocshim::Api;
using allocshim::DevPtr;
namespace res = allocshim::res;
namespace test = allocshim::test;

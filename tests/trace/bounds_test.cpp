// Traces that are small on disk but implausible inside, damaged size fields, cut files and pipes:
// every input is read in bounded memory, refused with its place when it cannot come from a writer,
// and never waited on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "analysis/load.h"
#include "analysis/reader.h"
#include "trace/recorder.h"

namespace {

struct Outcome {
  int status = -1;  // exit status, or 128 + signal
  std::string out, err;
};

// Runs a shell command with stdout and stderr captured; `timeout` kills a hang (exit 124).
Outcome run(const std::string& dir, const std::string& cmd) {
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const int s = std::system(("timeout -s KILL 60 " + cmd + " > " + out + " 2> " + err).c_str());
  Outcome r;
  r.status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
  r.out = test::read_text(out);
  r.err = test::read_text(err);
  return r;
}

void write_file(const std::string& path, const std::vector<unsigned char>& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// A chunk as the writer frames it, of any raw size (ChunkCompressor refuses more than the cap).
void append_chunk(std::vector<unsigned char>& file, const std::vector<unsigned char>& raw) {
  std::vector<unsigned char> frame(ZSTD_compressBound(raw.size()));
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
  const std::size_t n = ZSTD_compress2(c, frame.data(), frame.size(), raw.data(), raw.size());
  ZSTD_freeCCtx(c);
  ASSERT_FALSE(ZSTD_isError(n));
  unsigned char h[kChunkHeaderBytes];
  encode_chunk_header({static_cast<std::uint32_t>(n), static_cast<std::uint32_t>(raw.size())}, h);
  file.insert(file.end(), h, h + sizeof h);
  file.insert(file.end(), frame.begin(), frame.begin() + static_cast<std::ptrdiff_t>(n));
}

std::vector<unsigned char> file_header() {
  std::vector<unsigned char> b(kFileHeaderBytes);
  FileHeader h;
  h.pid = 42;
  encode_file_header(h, b.data());
  return b;
}

std::vector<unsigned char> definitions() {
  std::vector<unsigned char> raw;
  Encoder e(raw);
  test::record(e, Tag::process, 42, 1, 0, 1);
  e.str("/bin/prog");
  e.str("prog");
  test::record(e, Tag::backend, 0, 0);
  e.str("native");
  return raw;
}

// One thread segment of `n` alloc/free pairs, all at times from `t0` on: highly compressible.
std::vector<unsigned char> pairs(std::uint32_t tid, std::uint64_t t0, std::size_t n) {
  std::vector<unsigned char> raw;
  Encoder e(raw);
  test::record(e, Tag::thread, tid, t0);
  for (std::size_t i = 0; i < n; ++i) {
    test::record(e, Tag::alloc, 1, 0, 4096, zigzag(i == 0 ? 0x10000 : 0), 0, 0, 10, 0);
    test::record(e, Tag::free, 1, 0, 4096, zigzag(0), 0, 10, 0);
  }
  return raw;
}

// One thread segment of `n` allocations at consecutive addresses, none freed.
std::vector<unsigned char> leaks(std::uint32_t tid, std::uint64_t t0, std::uint64_t first,
                                 std::size_t n) {
  std::vector<unsigned char> raw;
  Encoder e(raw);
  test::record(e, Tag::thread, tid, t0);
  for (std::size_t i = 0; i < n; ++i) {
    test::record(e, Tag::alloc, 1, 0, 4096,
                 zigzag(i == 0 ? static_cast<std::int64_t>(first) : 4096), 0, 0, 10, 0);
  }
  return raw;
}

// A short traced run: `events` alloc/free events, stopped cleanly.
std::vector<unsigned char> short_run(const std::string& path, int events) {
  Recorder* r = test::start_recorder(path, StackMode::off);
  test::describe_two_backends(r);
  for (int i = 0; i < events / 2; ++i) {
    r->on_alloc(0x1000 + static_cast<DevPtr>(i) * 256, 256, 0, 0, Api::alloc, 3);
    r->on_free(0x1000 + static_cast<DevPtr>(i) * 256, 256, 0, 0, 3);
  }
  Recorder::stop();
  return test::read_bytes(path);
}

class TraceBounds : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::temp_path("bounds");
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
  const std::string tool_ = ALLOCSHIM_TOOL;
};

}  // namespace

// A 16 MiB chunk of records compresses to a few kilobytes; the reader refuses it by its declared
// size, with the file and the chunk's place, before decompressing anything.
TEST_F(TraceBounds, AChunkExpandingPastTheCapIsRefusedWithItsPlace) {
  std::vector<unsigned char> b = file_header();
  append_chunk(b, definitions());
  const std::size_t big_at = b.size();
  std::vector<unsigned char> raw = pairs(1, 1000, 0);
  while (raw.size() < (16u << 20)) {
    const std::vector<unsigned char> more = pairs(1, 1000, 100000);
    raw.insert(raw.end(), more.begin(), more.end());
  }
  append_chunk(b, raw);
  ASSERT_LT(b.size(), 64u << 10) << "small on disk";
  const std::string path = dir_ + "/bomb.trace";
  write_file(path, b);
  for (const char* cmd : {"report", "replay --simulate 1GiB"}) {
    const Outcome r = run(dir_, tool_ + " " + cmd + " " + path);
    EXPECT_EQ(r.status, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(path + ": corrupted trace: chunk 1 at byte " + std::to_string(big_at)),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("MiB a chunk may hold"), std::string::npos) << r.err;
  }
}

// Chunks that all cover the same stretch of time (no writer makes them) are not held at once: the
// stream keeps to its bound, says so, and still delivers every event. replay streams the same way.
TEST_F(TraceBounds, OverlappingChunksAreStreamedWithinTheBound) {
  std::vector<unsigned char> b = file_header();
  append_chunk(b, definitions());
  constexpr int kChunks = 20;
  constexpr std::size_t kPairs = 2000;
  for (int c = 0; c < kChunks; ++c)
    append_chunk(b, pairs(static_cast<std::uint32_t>(c + 1), 1000, kPairs));
  const std::string path = dir_ + "/overlap.trace";
  write_file(path, b);

  constexpr std::size_t kBound = 10000;
  EventStream stream(kBound);
  std::string error;
  ASSERT_TRUE(stream.open({path}, error)) << error;
  std::size_t events = 0;
  ASSERT_TRUE(stream.run([&](const Event&) { ++events; }, error)) << error;
  EXPECT_EQ(events, kChunks * kPairs * 2);
  EXPECT_LE(stream.peak_held(), kBound + 2 * kPairs) << "the bound plus one chunk";
  ASSERT_EQ(stream.warnings().size(), 1u);
  EXPECT_NE(stream.warnings()[0].find("out of time order"), std::string::npos)
      << stream.warnings()[0];

  // Within the default bound everything is held and merged exactly, as before.
  EventStream whole;
  ASSERT_TRUE(whole.open({path}, error)) << error;
  ASSERT_TRUE(whole.run([](const Event&) {}, error)) << error;
  EXPECT_EQ(whole.peak_held(), kChunks * kPairs * 2);
  EXPECT_TRUE(whole.warnings().empty());

  const Outcome r = run(dir_, tool_ + " replay --simulate 1GiB --json " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"allocs\": " + std::to_string(kChunks * kPairs)), std::string::npos)
      << r.out;
}

// Issue 45, row 7: a few kilobytes of chunks, each within what a chunk may hold, declaring
// millions of allocations that are never freed. Replay holds each live one in memory; past its
// limit it stops with the file and the place, instead of growing to gigabytes.
TEST_F(TraceBounds, ReplayStopsAtItsLiveLimitWithThePlace) {
  std::vector<unsigned char> b = file_header();
  append_chunk(b, definitions());
  constexpr int kChunks = 4;
  constexpr std::size_t kPerChunk = 300000;
  for (int c = 0; c < kChunks; ++c)
    append_chunk(b, leaks(static_cast<std::uint32_t>(c + 1), 1000 + 1000000ull * c,
                          (1ull << 40) * (c + 1), kPerChunk));
  ASSERT_LT(b.size(), 64u << 10) << "small on disk";
  const std::string path = dir_ + "/leaks.trace";
  write_file(path, b);
  Outcome r = run(dir_, tool_ + " replay --simulate 80GiB --max-live 500000 " + path);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find(path + ": more than 500000 allocations live at once"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out, "") << "no result from a replay cut short";
  // Within the limit the same file replays whole.
  r = run(dir_, tool_ + " replay --simulate 80GiB --json --max-live 2000000 " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"allocs\": " + std::to_string(kChunks * kPerChunk)), std::string::npos)
      << r.out;
}

// A damaged size field that points past the end of the file is corruption (exit 1, located), not
// a file cut short: the chunk's whole frame is there, and shorter than the field says.
TEST_F(TraceBounds, ADamagedChunkSizeIsCorruptionNotACut) {
  const std::string path = dir_ + "/three.trace";
  Recorder* r = test::start_recorder(path, StackMode::off);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 20; ++i)
      r->on_alloc(0x1000 + static_cast<DevPtr>(i) * 64, 64, 0, 0, Api::alloc, 1);
    r->flush();
  }
  Recorder::stop();
  std::vector<unsigned char> b = test::read_bytes(path);
  const std::vector<std::size_t> chunks = test::chunk_offsets(b);
  ASSERT_GE(chunks.size(), 3u);
  ASSERT_GE(chunks.size(), 4u) << "three chunks of events and the end record's";
  for (std::size_t c : {chunks.size() - 2, chunks.size() - 1}) {
    // The largest compressed size the chunk's raw size allows: past the end of the file.
    std::vector<unsigned char> d = b;
    ChunkHeader h;
    std::string e;
    ASSERT_TRUE(decode_chunk_header(d.data() + chunks[c], h, e)) << e;
    h.compressed = static_cast<std::uint32_t>(ZSTD_compressBound(h.raw));
    ASSERT_GT(chunks[c] + kChunkHeaderBytes + h.compressed, d.size());
    encode_chunk_header(h, d.data() + chunks[c]);
    const std::string damaged = dir_ + "/damaged.trace";
    write_file(damaged, d);
    const Outcome out = run(dir_, tool_ + " report " + damaged);
    EXPECT_EQ(out.status, 1) << "chunk " << c << ": " << out.err;
    EXPECT_NE(out.err.find(damaged + ": corrupted trace: chunk " + std::to_string(c) + " at byte " +
                           std::to_string(chunks[c])),
              std::string::npos)
        << out.err;
  }
  // A real cut inside the last chunk stays a warning.
  b.resize(chunks.back() + kChunkHeaderBytes + 3);
  write_file(path, b);
  const Outcome cut = run(dir_, tool_ + " report " + path);
  EXPECT_EQ(cut.status, 0) << cut.err;
  EXPECT_NE(cut.out.find("trace ends inside chunk"), std::string::npos) << cut.out;
}

// The end record travels in a chunk of its own: a short run's trace cut by one byte keeps every
// event (only the clean-shutdown mark is lost).
TEST_F(TraceBounds, AShortRunCutByOneByteKeepsItsEvents) {
  const std::string path = dir_ + "/short.trace";
  std::vector<unsigned char> b = short_run(path, 40);
  b.pop_back();
  Trace t;
  std::string error;
  ASSERT_TRUE(parse_trace(b.data(), b.size(), t, error)) << error;
  EXPECT_EQ(t.events.size(), 40u);
  EXPECT_FALSE(t.complete);
  write_file(path, b);
  const Outcome r = run(dir_, tool_ + " report -f json " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("\"allocs\": 20"), std::string::npos) << r.out;
}

// A program killed mid-run keeps what it recorded up to the writer's last flush (at most a second
// before the kill); nothing asks it to flush.
TEST_F(TraceBounds, AKilledProgramKeepsWhatWasFlushed) {
  const std::string path = dir_ + "/killed.trace";
  const pid_t child = fork();
  if (child == 0) {
    Config c;
    c.path = path;
    c.stacks = StackMode::off;
    std::string error;
    Recorder* r = Recorder::start(c, error);
    if (!r) _exit(2);
    for (int i = 0; i < 50; ++i)
      r->on_alloc(0x1000 + static_cast<DevPtr>(i) * 64, 64, 0, 0, Api::alloc, 1);
    sleep(2);  // more than the flush interval (200 ms) and the one second promised
    raise(SIGKILL);
    _exit(3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  Trace t;
  std::string error;
  ASSERT_TRUE(read_trace(path, t, error)) << error;
  EXPECT_EQ(t.events.size(), 50u);
  EXPECT_FALSE(t.complete);
}

// `report` of a FIFO nobody writes to is refused at once; `report <(cat t.trace)` reads the pipe as
// a stream and reports what the file gives.
TEST_F(TraceBounds, PipesAreStreamedAndAnUnfedFifoIsNotWaitedOn) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const Outcome unfed = run(dir_, tool_ + " report " + fifo);
  EXPECT_NE(unfed.status, 128 + SIGKILL) << "waited for a writer";
  EXPECT_EQ(unfed.status, 1) << unfed.err;
  EXPECT_NE(unfed.err.find(fifo + ": no data"), std::string::npos) << unfed.err;

  const std::string path = dir_ + "/t.trace";
  short_run(path, 40);
  const Outcome file = run(dir_, tool_ + " report -f json " + path);
  ASSERT_EQ(file.status, 0) << file.err;
  const Outcome piped = run(dir_, "bash -c '" + tool_ + " report -f json <(cat " + path + ")'");
  EXPECT_EQ(piped.status, 0) << piped.err;
  EXPECT_NE(piped.out.find("\"allocs\": 20"), std::string::npos) << piped.out;
  // The same figures (the path in the report differs).
  const std::string key = "\"totals\"";
  ASSERT_NE(file.out.find(key), std::string::npos) << file.out;
  EXPECT_EQ(piped.out.substr(piped.out.find(key), 400), file.out.substr(file.out.find(key), 400));
}

// record_size() walks exactly the records the reader decodes (the writer splits definitions with it).
TEST(TraceFormat, RecordSizeMatchesTheRecordsWritten) {
  const std::vector<unsigned char> raw = [] {
    std::vector<unsigned char> r = definitions();
    const std::vector<unsigned char> p = pairs(7, 5, 3);
    r.insert(r.end(), p.begin(), p.end());
    Encoder e(r);
    test::record(e, Tag::reload, 1, 1);
    e.str("policy.toml");
    test::record(e, Tag::stack_node, 1, 0, 0x4000);
    test::record(e, Tag::py_func, 1, 3);
    e.str("f");
    e.str("x.py");
    test::record(e, Tag::module, 1, 0, 0x1000, 0x2000);
    e.str("/lib/x.so");
    e.str("\x01\x02");
    test::record(e, Tag::migrate, 1, 0, 64, 0, 0, 1, 9);
    test::record(e, Tag::oom, 1, 0, 64, 128, 256, 0);
    test::record(e, Tag::alloc_fail, 1, 0, 64, 0, 0, 2, 9, 0);
    test::record(e, Tag::lost, 5);
    test::record(e, Tag::end, 10, 5);
    return r;
  }();
  std::size_t pos = 0, records = 0;
  while (pos < raw.size()) {
    const std::size_t n = record_size(raw.data() + pos, raw.size() - pos);
    ASSERT_GT(n, 0u) << "at byte " << pos;
    pos += n;
    ++records;
  }
  EXPECT_EQ(pos, raw.size());
  EXPECT_EQ(records, 2u + 1 + 6 + 9);
  EXPECT_EQ(record_size(raw.data(), 3), 0u) << "a record cut short";
}

// The HTML report: self-contained (no network), and its content as headless Chromium renders it
// (the script ran, the chart, table and flame graph are there). Skips when chromium is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "test_util.h"
#include "trace/analysis.h"
#include "trace/report.h"

using namespace allocshim::trace;
namespace test = allocshim::test;

namespace {

// Two sites with Python frames and a device timeline, without any trace file.
std::unique_ptr<Analysis> small_analysis() {
  Trace t;
  t.path = "html.trace";
  t.process.pid = 99;
  t.process.exe = "/usr/bin/python3 <script>";  // must come out escaped
  t.complete = true;
  t.functions[1] = {10, "forward", "net.py"};
  t.functions[2] = {20, "backward", "net.py"};
  t.nodes[1] = {0, python_frame(1, 11)};
  t.nodes[2] = {0, python_frame(2, 22)};
  t.backends[0] = {"native", 0};
  std::uint64_t time = 1000;
  for (int i = 0; i < 50; ++i) {
    Event a;
    a.kind = EventKind::alloc;
    a.time_ns = time += 1000;
    a.size = 1 << 20;
    a.addr = 0x1000000 + static_cast<std::uint64_t>(i) * (1 << 20);
    a.stack = i % 2 ? 1 : 2;
    t.events.push_back(a);
  }
  for (int i = 0; i < 50; ++i) {
    Event f;
    f.kind = EventKind::free;
    f.time_ns = time += 1000;
    f.size = 1 << 20;
    f.addr = 0x1000000 + static_cast<std::uint64_t>(i) * (1 << 20);
    t.events.push_back(f);
  }
  std::vector<Trace> traces;
  traces.push_back(std::move(t));
  return analyze(std::move(traces));
}

std::string html_of(const Analysis& a) {
  std::ostringstream out;
  write_html(a, ReportOptions{}, out);
  return out.str();
}

std::string find_chromium() {
  for (const char* c : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
    if (access(c, X_OK) == 0) return c;
  return {};
}

std::string run(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    pclose(p);
  }
  return out;
}

}  // namespace

TEST(TraceHtml, SelfContained) {
  const std::string html = html_of(*small_analysis());
  // Nothing fetched from anywhere: no external scripts, styles, images or fonts.
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_NE(html.find("/usr/bin/python3 &lt;script&gt;"), std::string::npos);
  EXPECT_NE(html.find("<svg id=\"memory\""), std::string::npos);
  EXPECT_NE(html.find("<svg id=\"flame\""), std::string::npos);
}

TEST(TraceHtml, RendersInHeadlessChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  const std::string dir = test::temp_path("html");
  const std::string file = dir + ".html";
  std::ofstream(file) << html_of(*small_analysis());
  const std::string dom = run(chromium +
                              " --headless --no-sandbox --disable-gpu --disable-background-networking"
                              " --disable-component-update --disable-sync --no-first-run"
                              " --user-data-dir=" + dir + ".profile --dump-dom file://" + file +
                              " 2>/dev/null");
  ASSERT_FALSE(dom.empty()) << "chromium printed nothing";
  // The script ran: it marks the body and writes the summary from the embedded data.
  EXPECT_NE(dom.find("data-ready=\"yes\""), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("50 allocations (50.0 MiB), 50 frees, 0 failed; peak 50.0 MiB"), std::string::npos)
      << dom.substr(0, 2000);
  // Top sites, the memory chart and the flame graph.
  EXPECT_NE(dom.find("forward (net.py:11)"), std::string::npos);
  EXPECT_NE(dom.find("backward (net.py:22)"), std::string::npos);
  EXPECT_NE(dom.find("class=\"series\""), std::string::npos);
  EXPECT_NE(dom.find("class=\"frame\""), std::string::npos);
  run("rm -rf " + dir + ".profile " + file);
}

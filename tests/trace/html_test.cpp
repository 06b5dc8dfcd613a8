// The HTML report: self-contained (no network), and its content as headless Chromium renders it
// (the script ran, the chart, table and flame graph are there). Skips when chromium is absent.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "test_util.h"
#include "analysis/analysis.h"
#include "analysis/report.h"

namespace {

// A small training loop with Python frames: per step a temporary batch, activations from forward
// freed by backward, gradients; in step 3 two blocks spill to host memory (one promoted back later),
// an out-of-memory, and one block never freed. Built without a trace file.
std::unique_ptr<Analysis> small_analysis() {
  constexpr std::uint64_t kMiB = 1ull << 20;
  Trace t;
  t.path = "html.trace";
  t.process.pid = 99;
  t.process.exe = "/usr/bin/python3 <script>";  // must come out escaped
  t.complete = true;
  t.functions[1] = {48, "main", "train.py"};
  t.functions[2] = {10, "forward", "net.py"};
  t.functions[3] = {20, "backward", "net.py"};
  t.functions[4] = {30, "load_batch", "data.py"};
  t.nodes[1] = {0, python_frame(1, 50)};
  t.nodes[2] = {1, python_frame(2, 11)};
  t.nodes[3] = {1, python_frame(3, 22)};
  t.nodes[4] = {1, python_frame(4, 33)};
  t.backends[0] = {"vmm", static_cast<std::uint8_t>(allocshim::BackendKind::vmm)};
  t.backends[1] = {"host", static_cast<std::uint8_t>(allocshim::BackendKind::host)};
  std::uint64_t time = 1000000, next_addr = 0x7f0000000000;
  auto event = [&](EventKind k, std::uint64_t size, std::uint64_t addr, std::uint32_t stack,
                   int backend = 0) {
    Event e;
    e.kind = k;
    e.time_ns = time += 250000;
    e.size = size;
    e.addr = addr;
    e.stack = stack;
    e.backend = backend;
    e.dur_ns = 20000;
    t.events.push_back(e);
    return &t.events.back();
  };
  auto alloc = [&](std::uint64_t size, std::uint32_t stack, int backend = 0) {
    const std::uint64_t addr = next_addr;
    next_addr += size;
    Event* e = event(EventKind::alloc, size, addr, stack, backend);
    if (backend == 1) e->flags = kAllocSpilled;
    return addr;
  };
  for (int step = 0; step < 5; ++step) {
    const std::uint64_t batch = alloc(64 * kMiB, 4);
    std::vector<std::uint64_t> acts;
    for (int i = 0; i < 4; ++i) acts.push_back(alloc((96 + 32 * i) * kMiB, 2));
    std::uint64_t spilled = 0;
    if (step == 2) {
      spilled = alloc(256 * kMiB, 2, 1);
      event(EventKind::oom, 512 * kMiB, 0, 2)->budget = 1024 * kMiB;
    }
    event(EventKind::free, 64 * kMiB, batch, 0);
    for (int i = 3; i >= 0; --i) {
      const std::uint64_t grad = alloc(48 * kMiB, 3);
      event(EventKind::free, (96 + 32 * i) * kMiB, acts[static_cast<std::size_t>(i)], 0);
      event(EventKind::free, 48 * kMiB, grad, 0);
      if (spilled && i == 2) event(EventKind::migrate, 256 * kMiB, spilled, 0, 1)->to_backend = 0;
    }
    if (spilled) event(EventKind::free, 256 * kMiB, spilled, 0);
  }
  alloc(32 * kMiB, 1);  // never freed
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

// Each of `parts` appears in `text`.
void expect_contains(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts)
    EXPECT_NE(text.find(part), std::string::npos) << "missing: " << part;
}

}  // namespace

TEST(TraceHtml, SelfContained) {
  const std::string html = html_of(*small_analysis());
  // Nothing fetched from anywhere: no external scripts, styles, images or fonts.
  for (const char* external : {"src=", "href=", "@import", "url("})
    EXPECT_EQ(html.find(external), std::string::npos) << external;
  expect_contains(html, {"/usr/bin/python3 &lt;script&gt;", "<canvas id=\"timeline-canvas\"",
                         "<div id=\"flame\""});
}

TEST(TraceHtml, RendersInHeadlessChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  const std::string dir = test::temp_path("html");
  const std::string file = dir + ".html";
  std::ofstream(file) << html_of(*small_analysis());
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --disable-background-networking"
      " --disable-component-update --disable-sync --no-first-run --window-size=1300,1900"
      " --user-data-dir=" +
      dir + ".profile ";
  const std::string dom = run(chromium + flags + "--dump-dom file://" + file + " 2>/dev/null");
  // ALLOCSHIM_HTML_SCREENSHOT=FILE.png: keep a picture of the page to look at.
  if (const char* png = std::getenv("ALLOCSHIM_HTML_SCREENSHOT")) {
    run(chromium + flags + "--screenshot=" + png + " file://" + file + " 2>/dev/null");
    run(chromium + flags + "--screenshot=" + png + ".site.png 'file://" + file +
        "#site&hover=300,60' 2>/dev/null");
  }
  run("rm -rf " + dir + ".profile " + file);
  ASSERT_FALSE(dom.empty()) << "chromium printed nothing";
  // The script ran to its end without an exception.
  EXPECT_NE(dom.find("data-ready=\"yes\""), std::string::npos) << dom.substr(0, 3000);
  EXPECT_NE(
      dom.find(
          "47 allocations (4.3 GiB), 46 frees, 0 failed, 1 out of memory; peak 896.0 MiB live at 10.2 ms"),
      std::string::npos)
      << dom.substr(0, 3000);
  // The timeline drew its layers (device and host backends), a column per pixel and the marks of the
  // out-of-memory and the migration; its legend names the backends.
  expect_contains(dom, {"data-layers=\"2\"", "data-marks=\"2\"", "device 0 host (host memory)"});
  EXPECT_EQ(dom.find("data-columns=\"0\""), std::string::npos);
  // The sites table and the flame graph with the Python frames.
  expect_contains(dom, {"forward (net.py:11)", "backward (net.py:22)",
                        "data-site=", "<svg width=", "class=\"frame", "main (train.py:50)</text>"});

  // Stacked by site: a layer per site and placement (forward's spilled block on the host side).
  std::ofstream(file) << html_of(*small_analysis());
  const std::string by_site =
      run(chromium + flags + "--dump-dom file://" + file + "#site 2>/dev/null");
  // Hovering just above the zero line early in step 0: the bottom layer there is forward's (the
  // site that held the most), and the tooltip shows its stack.
  const std::string hover =
      run(chromium + flags + "--dump-dom 'file://" + file + "#site&hover=20,3' 2>/dev/null");
  run("rm -rf " + dir + ".profile " + file);
  expect_contains(by_site, {"data-ready=\"yes\"", "data-layers=\"5\"",
                            "forward (net.py:11) (host)</span>", "load_batch (data.py:33)</span>"});
  EXPECT_NE(hover.find("display: block"), std::string::npos)
      << hover.substr(hover.find("tooltip") - 20, 400);
  EXPECT_NE(hover.find("  at forward (net.py:11)\n  by main (train.py:50)"), std::string::npos)
      << hover.substr(hover.find("id=\"tooltip\"") - 20, 400);
}

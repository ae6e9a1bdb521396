// The test mains' check that a run ran something: test executables built from several
// test files (tessera_add_test's GROUP) run one file's cases per ctest test, chosen by
// doctest's --source-file filter, and a filter that matches no case would otherwise pass
// without running anything. Included by the mains only, after DOCTEST_CONFIG_IMPLEMENT.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>

namespace tessera_test {

// Counts the test cases that passed the filters of the last run; a query (--help,
// --list-test-cases) ends no run and leaves it unset.
struct run_counter : doctest::IReporter {
  static inline int passing_filters = -1;

  explicit run_counter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    passing_filters = static_cast<int>(stats.numTestCasesPassingFilters);
  }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("tessera_run_counter", 0, run_counter);

// A run's exit status: `result` (doctest's), or 1 when the run's filters matched no
// test case, saying so.
inline int fail_if_ran_none(int result) {
  if (result == 0 && run_counter::passing_filters == 0) {
    std::fprintf(stderr, "no test case matched the filters (--source-file, --test-case): nothing was tested\n");
    return 1;
  }
  return result;
}

}  // namespace tessera_test

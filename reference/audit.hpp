// `tandem audit LOG.jsonl`: checks every iteration record exactly against what it proves about
// itself (record_audit.hpp: the clip decision and coefficient, lr and wd from the schedule, the
// counters and token totals), and recomputes every audited AdamW update of the log (the
// --audit-params entries) from its logged inputs in 50-digit arithmetic, with the reference's own
// adamw_update, comparing each logged result against a bound for the log's precision.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reference/record_audit.hpp"

namespace tandem::reference {

// One recomputed quantity of one audited element.
struct AuditFinding {
  std::int64_t iteration = 0;
  std::string tensor;
  std::int64_t element = 0;
  std::string quantity;  // "m", "v" or "new_value"
  double logged = 0;
  double recomputed = 0;  // the 50-digit result, rounded to double for printing
  double error = 0;       // |logged - recomputed|, computed in 50 digits
  double bound = 0;
  bool ok() const { return error <= bound; }
};

struct AuditReport {
  std::string precision;  // of the log's main state: "fp32", "double" or "float50"
  std::int64_t iterations = 0;
  std::int64_t entries = 0;
  std::vector<AuditFinding> findings;  // every comparison of an audited AdamW update
  std::vector<RecordFinding> record_findings;  // every failed exact check of a record
  // Lines skipped as torn (a run killed while writing them): the last line, or a line followed by
  // a resumed run's header. Any other line that is not JSON is an error.
  std::vector<std::string> warnings;
  const AuditFinding* worst() const;   // largest error / bound; null when there are none
  // At least one iteration record, no failed record check, every AdamW finding within its bound
  // (a log without --audit-params entries has none to recompute).
  bool ok() const;
};

// Reads the log (header first, then iteration records); throws std::runtime_error naming the
// line when the log is malformed or carries no header.
AuditReport audit_log(const std::string& path);

// Unit roundoff of a log's main precision: 2^-24 for fp32, 2^-53 for double and for float50
// (whose values reach the log rounded to double).
double unit_roundoff(const std::string& precision);

}  // namespace tandem::reference

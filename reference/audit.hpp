// `tandem audit LOG.jsonl`: recomputes every audited AdamW update of a training log (the
// --audit-params entries) from its logged inputs in 50-digit arithmetic, with the reference's own
// adamw_update, and compares each logged result against a bound for the log's precision.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  std::vector<AuditFinding> findings;  // every comparison
  // Lines skipped as torn (a run killed while writing them): the last line, or a line followed by
  // a resumed run's header. Any other line that is not JSON is an error.
  std::vector<std::string> warnings;
  const AuditFinding* worst() const;   // largest error / bound; null when there are none
  bool ok() const;                     // every finding within its bound, and at least one
};

// Reads the log (header first, then iteration records); throws std::runtime_error naming the
// line when the log is malformed or carries no header.
AuditReport audit_log(const std::string& path);

// Unit roundoff of a log's main precision: 2^-24 for fp32, 2^-53 for double and for float50
// (whose values reach the log rounded to double).
double unit_roundoff(const std::string& precision);

}  // namespace tandem::reference

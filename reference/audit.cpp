// `tandem audit`: recompute audited AdamW updates in 50 digits (audit.hpp).
#include "reference/audit.hpp"

#include <cmath>
#include <fstream>
#include <stdexcept>

#include <boost/multiprecision/cpp_bin_float.hpp>
#include <nlohmann/json.hpp>

#include "core/config.hpp"
#include "core/train/records.hpp"
#include "reference/adamw.hpp"

namespace tandem::reference {
namespace {

using Wide = boost::multiprecision::cpp_bin_float_50;

// Error bounds of the engine's own evaluation of SPEC 7, from exact logged inputs, with u the
// unit roundoff of its arithmetic (each +, -, *, /, sqrt rounds once, relative error <= u):
//   m = b1*m_old + (1-b1)*g: (1-b1), two products and the sum round: |err| <= 3u(|b1 m_old| +
//     |(1-b1) g|) to first order; v likewise with g*g one more rounding: 4u(|b2 v_old| +
//     |(1-b2) g^2|).
//   new = p - lr*(a + wd*p), a = m_hat/(sqrt(v_hat)+eps) from the logged m, v:
//     b^t by t multiplications has relative error <= t*u, so 1-b^t has <= t*u*b^t/(1-b^t) + u;
//     a then has relative error e_a <= 6u + e1 + e2/2 (two quotients, sqrt, +eps, and the bias
//     corrections e1, e2); the bracket adds wd*p (2 roundings), times lr (1), minus (1):
//     |err| <= lr*(|a| e_a + 3u(|a| + wd|p|)) + u|new|.
// These first-order bounds are doubled to cover second-order terms (products of two u's); a
// logged value is additionally a double, whose own rounding (u_log = 2^-53 relative) is added.
constexpr double kSecondOrderMargin = 2.0;
const double kLogRoundoff = std::ldexp(1.0, -53);

double bias_correction_error(double beta, std::int64_t step, double u) {
  const double power = std::pow(beta, static_cast<double>(step));
  return power >= 1.0 ? 0.0 : static_cast<double>(step) * u * power / (1.0 - power) + u;
}

}  // namespace

double unit_roundoff(const std::string& precision) {
  if (precision == "fp32") return std::ldexp(1.0, -24);
  if (precision == "double" || precision == "float50") return std::ldexp(1.0, -53);
  throw std::runtime_error("audit: unknown precision \"" + precision +
                           "\" in the log header; expected fp32, double or float50");
}

const AuditFinding* AuditReport::worst() const {
  const AuditFinding* worst_finding = nullptr;
  double worst_ratio = -1.0;
  for (const auto& finding : findings) {
    const double ratio = finding.bound > 0 ? finding.error / finding.bound
                                           : (finding.error > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio || std::isnan(ratio)) {
      worst_ratio = ratio;
      worst_finding = &finding;
    }
  }
  return worst_finding;
}

bool AuditReport::ok() const {
  if (iterations == 0 || !record_findings.empty()) return false;
  for (const auto& finding : findings) {
    if (!finding.ok()) return false;
  }
  return true;
}

AuditReport audit_log(const std::string& path) {
  std::ifstream input(path);
  if (!input) {
    throw std::runtime_error("audit: cannot open " + path + "; fix: pass the --log file of a run");
  }
  AuditReport report;
  RecordAuditor records;
  OptimizerConfig optimizer;
  bool have_header = false;
  std::vector<std::string> lines;
  for (std::string line; std::getline(input, line);) lines.push_back(std::move(line));
  // The next line after `index` that holds anything, or none.
  const auto next_content = [&lines](std::size_t index) -> const std::string* {
    for (std::size_t next = index + 1; next < lines.size(); ++next) {
      if (!lines[next].empty()) return &lines[next];
    }
    return nullptr;
  };
  std::int64_t line_number = 0;
  for (std::size_t index = 0; index < lines.size(); ++index) {
    const std::string& line = lines[index];
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& error) {
      // A torn record: the run was killed while writing it. Skipped when nothing follows it or
      // a resumed run's header does (JsonlLog starts a resumed run on a new line).
      const std::string* next = next_content(index);
      bool resumed_after = false;
      if (next != nullptr) {
        try {
          resumed_after = nlohmann::json::parse(*next).value("type", "") == "header";
        } catch (const nlohmann::json::parse_error&) {
        }
      }
      if (next == nullptr || resumed_after) {
        report.warnings.push_back("line " + std::to_string(line_number) + " is torn (" + std::to_string(line.size()) +
                                  " bytes that are not JSON" +
                                  (next == nullptr ? ", the last line" : ", before a resumed run's header") +
                                  "): the run was killed while writing it; skipped");
        continue;
      }
      throw std::runtime_error("audit: " + path + " line " + std::to_string(line_number) +
                               " is not JSON (" + error.what() + ")");
    }
    const std::string type = record.value("type", "");
    if (type == "header") {
      const auto& config = record.at("config").at("optimizer");
      optimizer.adam_beta1 = config.at("adam_beta1").get<double>();
      optimizer.adam_beta2 = config.at("adam_beta2").get<double>();
      optimizer.adam_eps = config.at("adam_eps").get<double>();
      report.precision = record.at("main_precision").get<std::string>();
      records.header(record, line_number);
      have_header = true;
      continue;
    }
    if (type != "iteration") continue;
    if (!have_header) {
      throw std::runtime_error("audit: " + path + " line " + std::to_string(line_number) +
                               ": an iteration record before the header record");
    }
    ++report.iterations;
    records.iteration(record, line_number);
    if (!record.contains("audit")) continue;
    const double u = unit_roundoff(report.precision);
    const std::int64_t iteration = record.at("iteration").get<std::int64_t>();
    for (const auto& json_entry : record.at("audit")) {
      const AuditEntry entry = json_entry.get<AuditEntry>();
      ++report.entries;
      const AdamHyper<Wide> hyper(optimizer, entry.step);
      auto finding = [&](const char* quantity, double logged, const Wide& exact, double bound) {
        AuditFinding f;
        f.iteration = iteration;
        f.tensor = entry.tensor;
        f.element = entry.element;
        f.quantity = quantity;
        f.logged = logged;
        f.recomputed = static_cast<double>(exact);
        f.error = static_cast<double>(abs(Wide(logged) - exact));
        f.bound = kSecondOrderMargin * bound + kLogRoundoff * std::abs(logged);
        report.findings.push_back(f);
      };
      const double b1 = optimizer.adam_beta1;
      const double b2 = optimizer.adam_beta2;

      // m and v from the logged old moments and gradient.
      Wide param = Wide(entry.old_value);
      Wide exp_avg = Wide(entry.old_m);
      Wide exp_avg_sq = Wide(entry.old_v);
      adamw_update(hyper, Wide(entry.lr), Wide(entry.wd), Wide(entry.grad), param, exp_avg,
                   exp_avg_sq);
      finding("m", entry.m, exp_avg,
              3 * u * (std::abs(b1 * entry.old_m) + std::abs((1 - b1) * entry.grad)));
      finding("v", entry.v, exp_avg_sq,
              4 * u * (std::abs(b2 * entry.old_v) + std::abs((1 - b2) * entry.grad * entry.grad)));

      // The new weight from the logged new moments, so m's and v's own errors do not enter.
      using boost::multiprecision::sqrt;
      const Wide m_hat = Wide(entry.m) / hyper.bias_correction1;
      const Wide v_hat = Wide(entry.v) / hyper.bias_correction2;
      const Wide adam_term = m_hat / (sqrt(v_hat) + hyper.eps);
      const Wide p_old = Wide(entry.old_value);
      const Wide p_new = p_old - Wide(entry.lr) * (adam_term + Wide(entry.wd) * p_old);
      const double a = std::abs(static_cast<double>(adam_term));
      const double e_a =
          6 * u + bias_correction_error(b1, entry.step, u) + bias_correction_error(b2, entry.step, u) / 2;
      finding("new_value", entry.new_value, p_new,
              entry.lr * (a * e_a + 3 * u * (a + entry.wd * std::abs(entry.old_value))) +
                  u * std::abs(entry.new_value));
    }
  }
  if (!have_header) {
    throw std::runtime_error("audit: " + path +
                             " has no header record; fix: pass a log written by tandem train");
  }
  report.record_findings = records.findings();
  return report;
}

}  // namespace tandem::reference

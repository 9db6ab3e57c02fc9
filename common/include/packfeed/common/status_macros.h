#ifndef PACKFEED_COMMON_STATUS_MACROS_H_
#define PACKFEED_COMMON_STATUS_MACROS_H_

// Debian's Abseil (20220623) has no status macros of its own; these two are
// ours. Both evaluate their argument exactly once.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Returns the status from the enclosing function when `expr` is not OK.
#define PF_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status pf_status_ = (expr);      \
    if (!pf_status_.ok()) return pf_status_; \
  } while (false)

#define PF_INTERNAL_CONCAT_(a, b) a##b
#define PF_INTERNAL_CONCAT(a, b) PF_INTERNAL_CONCAT_(a, b)
#define PF_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = *std::move(tmp)

// `lhs = value of expr` when `expr` (a StatusOr) is OK; otherwise returns its
// status. `lhs` may declare a variable: PF_ASSIGN_OR_RETURN(auto x, F());
#define PF_ASSIGN_OR_RETURN(lhs, expr) \
  PF_INTERNAL_ASSIGN_OR_RETURN(PF_INTERNAL_CONCAT(pf_statusor_, __LINE__), lhs, expr)

#endif  // PACKFEED_COMMON_STATUS_MACROS_H_

// Early-return helpers for absl::Status / absl::StatusOr. Header-only, no dependencies beyond absl.
#ifndef PDSERVE_COMMON_BASE_STATUS_MACROS_H_
#define PDSERVE_COMMON_BASE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PD_STATUS_CONCAT_INNER_(a, b) a##b
#define PD_STATUS_CONCAT_(a, b) PD_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define PD_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    const ::absl::Status pd_status_ = (expr);     \
    if (!pd_status_.ok()) return pd_status_;      \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define PD_ASSIGN_OR_RETURN(lhs, rexpr) \
  PD_ASSIGN_OR_RETURN_IMPL_(PD_STATUS_CONCAT_(pd_statusor_, __LINE__), lhs, rexpr)
#define PD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                              \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

#endif  // PDSERVE_COMMON_BASE_STATUS_MACROS_H_

/* Log lines in the style of NCCL_DEBUG: "host:pid rank R dgcshim LEVEL msg",
 * filtered by DGC_LOG_LEVEL. Errors always print. */
#ifndef DGCSHIM_LOG_H
#define DGCSHIM_LOG_H

#include "dgcshim/config.h"

void dgc_log(dgc_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prints regardless of DGC_LOG_LEVEL, with tag in place of the level
 * (used for the DGC_STATS report). */
void dgc_log_tagged(const char *tag, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DGC_ERROR(...) dgc_log(DGC_LOG_ERROR, __VA_ARGS__)
#define DGC_WARN(...) dgc_log(DGC_LOG_WARN, __VA_ARGS__)
#define DGC_INFO(...) dgc_log(DGC_LOG_INFO, __VA_ARGS__)
#define DGC_DEBUG(...) dgc_log(DGC_LOG_DEBUG, __VA_ARGS__)

#endif

/* The DGC_STATS report (core/report.c). */
#ifndef DGCSHIM_REPORT_H
#define DGCSHIM_REPORT_H

#include <stddef.h>

#include "registry.h"

/* Every live entry's row and the freed states', the totals, the failures by
 * cause and the memory, as STATS log lines. Printed on rank 0 by whichever
 * front end claims DGC_FLAG_REPORTED first (MPI_Finalize, or the NCCL front
 * end at exit in a process that never finalised MPI). */
void dgc_stats_report(void);

/* "type 4, small 2": the pass-through calls of t by reason, those with
 * any; "" when none passed through. */
void dgc_report_pass_reasons(const dgc_registry_totals *t, char *buf, size_t len);

#endif

/* The DGC_STATS report (core/report.c). */
#ifndef DGCSHIM_REPORT_H
#define DGCSHIM_REPORT_H

/* Every live entry's row and the freed states', the totals, the failures by
 * cause and the memory, as STATS log lines. Printed on rank 0 by whichever
 * front end claims DGC_FLAG_REPORTED first (MPI_Finalize, or the NCCL front
 * end at exit in a process that never finalised MPI). */
void dgc_stats_report(void);

#endif

/* DGC_STATS_FILE: every rank's statistics as JSON lines (core/stats_file.c),
 * the machine-readable twin of the DGC_STATS report, read by `dgcshim report`. */
#ifndef DGCSHIM_STATS_FILE_H
#define DGCSHIM_STATS_FILE_H

/* After each compressed call, on either path: writes a line every
 * DGC_STATS_EVERY compressed calls of the process. Nothing without
 * DGC_STATS_FILE. */
void dgc_stats_file_tick(void);

/* At MPI_Finalize, or at exit in a process that never finalised MPI: the
 * last line, once per process. */
void dgc_stats_file_final(void);

#endif

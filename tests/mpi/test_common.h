/* Helpers the MPI test programs share. They are ordinary MPI programs that
 * know nothing of the shim's code. */
#ifndef DGC_TEST_COMMON_H
#define DGC_TEST_COMMON_H

#include <mpi.h>
#include <stdint.h>

/* This process's rank and the job's size in MPI_COMM_WORLD; set by
 * test_init. */
extern int rank, nranks;

/* MPI_Init_thread with required (MPI_THREAD_SINGLE for most tests); fails
 * when the library gives less. */
void test_init(int *argc, char ***argv, int required);

/* Prints "FAIL rank R: ..." and aborts the job. */
void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

uint64_t splitmix(uint64_t x);

/* The gradient of rank r at step s, element i: uniform in [-1, 1) times a
 * per-element scale spanning three decades, like layers of different sizes. */
float grad(int r, long s, long i);
void fill_grad(float *g, int r, long s, long n);

/* Fails unless every rank of comm holds the same n floats at out. */
void check_identical(const float *out, long n, MPI_Comm comm, const char *what);

/* A field of /proc/self/status in kB ("VmRSS", "VmHWM", "VmSize"); fails
 * when it is missing. */
long status_kb(const char *field);

/* k = ceil(density * n), at least 1, forgiving the rounding of 1 - sparsity
 * (0.001 comes out a hair above 0.001 in double). */
long k_for(long n, double density);

/* The first step of DGC from fresh state on every rank with exact top-k
 * (DGC_SAMPLE_RATIO=1): each rank sends its k largest |g| (any momentum: u
 * and v both start at g), the output is their sum in rank order. g(r, i)
 * gives rank r's gradient; out gets the sum. */
void first_step_reference(long n, long k, int ranks, float (*g)(int r, long i, void *ctx), void *ctx, float *out);

#endif

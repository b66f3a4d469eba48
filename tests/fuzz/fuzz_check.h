/* The fuzz targets' assertion: a check that fails aborts, naming itself, so
 * that libFuzzer saves the input and scripts/fuzz.sh finds "check failed". */
#ifndef DGC_FUZZ_CHECK_H
#define DGC_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                                  \
    do {                                                                          \
        if (!(c)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            abort();                                                              \
        }                                                                         \
    } while (0)

#endif

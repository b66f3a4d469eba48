#include "pages.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* From here up a block is mapped on its own. */
#define MAPPED_MIN ((size_t)256 << 10)
/* Blocks at least this large are aligned to it, so that the kernel can back
 * them with huge pages: the update pass streams through several arrays, and
 * with 4 KiB pages it would take a TLB miss every 1024 floats of each. */
#define HUGE_PAGE ((size_t)2 << 20)

static size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

static size_t page_size(void) {
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t mapped_length(size_t bytes) {
    return round_up(bytes, bytes >= HUGE_PAGE ? HUGE_PAGE : page_size());
}

/* Maps len bytes aligned to align by mapping align more and trimming. */
static void *map_aligned(size_t len, size_t align) {
    size_t over = len + (align > page_size() ? align : 0);
    char *p = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    if (over == len) return p;
    char *start = (char *)round_up((size_t)(uintptr_t)p, align);
    if (start > p) munmap(p, (size_t)(start - p));
    size_t tail = (size_t)(p + over - (start + len));
    if (tail) munmap(start + len, tail);
    return start;
}

void *dgc_pages_alloc(size_t bytes) {
    size_t len;
    void *p;
    if (bytes < MAPPED_MIN) {
        len = round_up(bytes ? bytes : 1, 64);
        p = aligned_alloc(64, len);
    } else {
        len = mapped_length(bytes);
        p = map_aligned(len, len >= HUGE_PAGE ? HUGE_PAGE : page_size());
#ifdef MADV_HUGEPAGE
        if (p && len >= HUGE_PAGE) madvise(p, len, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    }
    /* Fresh mapped pages read as zero already; writing them now takes the
     * page faults (and the kernel's huge-page compaction) here, when a state
     * is created, instead of inside a later call's update pass, which would
     * then run several times slower. */
    if (p) memset(p, 0, len);
    return p;
}

void dgc_pages_free(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < MAPPED_MIN) free(p);
    else munmap(p, mapped_length(bytes));
}

int dgc_pages_fit(void **p, size_t *cap, size_t want, size_t slack) {
    if (want == 0) { /* nothing needed (a dense-transport call's gathered buffer): all given back */
        dgc_pages_free(*p, *cap);
        *p = NULL;
        *cap = 0;
        return 0;
    }
    int shrink = *cap > slack * want && *cap - want > ((size_t)64 << 10);
    if (*cap >= want && !shrink) return 0;
    dgc_pages_free(*p, *cap);
    *cap = 0;
    *p = dgc_pages_alloc(want);
    if (!*p) return -1;
    *cap = want;
    return 0;
}

size_t dgc_pages_footprint(size_t bytes) {
    return bytes < MAPPED_MIN ? round_up(bytes ? bytes : 1, 64) : mapped_length(bytes);
}

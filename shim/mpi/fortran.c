/* Fortran entry points. Open MPI's Fortran bindings (mpif.h and `use mpi`:
 * libmpi_mpifh; `use mpi_f08`: libmpi_usempif08, which calls into
 * libmpi_mpifh's ompi_*_f) call PMPI_Init and PMPI_Allreduce directly, so a
 * Fortran program never reaches the C interposers: without these, it would
 * run uncompressed and unconfigured.
 *
 * Each function is defined under every name a Fortran compiler or the f08
 * module calls it by (mpi_allreduce_, mpi_allreduce__, mpi_allreduce,
 * MPI_ALLREDUCE, ompi_allreduce_f). Handles are converted with the _f2c
 * functions and the call goes through the same path as C's; a call that is
 * not compressed goes on to the real Fortran function of the same name
 * (found with RTLD_NEXT), so it behaves exactly as without the shim.
 *
 * MPICH's bindings call the C functions (MPI_Init, MPI_Allreduce), which the
 * shim interposes anyway, except its mpi_f08 MPI_Init (mpi_init_f08_),
 * which calls PMPI_Init: that one is defined here too.
 *
 * MPI_Finalize and MPI_Comm_free need nothing here: MPI_COMM_SELF's and the
 * communicators' attributes (mpi/comm.c) run on every path. */
#include <dlfcn.h>

#include "core/log.h"
#include "internal.h"

/* Registry slots: the real function behind each name, and the sentinels. */
enum {
    SLOT_IN_PLACE,
    SLOT_BOTTOM,
    SLOT_SENTINELS_LOOKED_UP,
    SLOT_NAMES /* then one slot per name below */
};

typedef enum { NAME_INIT, NAME_INIT_THREAD, NAME_ALLREDUCE, NAME_COUNT } routine;

/* Every spelling of each routine, in slot order: the compilers' four,
 * Open MPI's internal one, and MPICH's mpi_f08 one (whose MPI_Init calls
 * PMPI_Init; its MPI_Allreduce reaches the C entry point). */
#define SPELLINGS 6
static const char *const names[NAME_COUNT][SPELLINGS] = {
    {"mpi_init_", "mpi_init__", "mpi_init", "MPI_INIT", "ompi_init_f", "mpi_init_f08_"},
    {"mpi_init_thread_", "mpi_init_thread__", "mpi_init_thread", "MPI_INIT_THREAD", "ompi_init_thread_f",
     "mpi_init_thread_f08_"},
    {"mpi_allreduce_", "mpi_allreduce__", "mpi_allreduce", "MPI_ALLREDUCE", "ompi_allreduce_f", NULL},
};
_Static_assert(SLOT_NAMES + NAME_COUNT * SPELLINGS <= DGC_SLOT_COUNT, "registry slots");

/* The function the program would have called without the shim. */
static void *real(routine r, int spelling) {
    int slot = SLOT_NAMES + (int)r * SPELLINGS + spelling;
    void *f = dgc_registry_slot(slot);
    if (!f) {
        f = dlsym(RTLD_NEXT, names[r][spelling]);
        if (!f) {
            DGC_ERROR("%s: no such function in the MPI libraries loaded after the shim", names[r][spelling]);
            PMPI_Abort(MPI_COMM_WORLD, 1);
        }
        dgc_registry_set_slot(slot, f);
    }
    return f;
}

/* Open MPI's Fortran MPI_IN_PLACE and MPI_BOTTOM are the addresses of
 * common blocks in libmpi. */
static void look_up_sentinels(void) {
    if (dgc_registry_slot(SLOT_SENTINELS_LOOKED_UP)) return;
    dgc_registry_set_slot(SLOT_IN_PLACE, dlsym(RTLD_DEFAULT, "mpi_fortran_in_place_"));
    dgc_registry_set_slot(SLOT_BOTTOM, dlsym(RTLD_DEFAULT, "mpi_fortran_bottom_"));
    dgc_registry_set_slot(SLOT_SENTINELS_LOOKED_UP, (void *)1);
    if (!dgc_registry_slot(SLOT_IN_PLACE))
        DGC_WARN("this MPI's Fortran MPI_IN_PLACE is unknown to the shim: Fortran all-reduces pass through");
}

typedef void (*init_fn)(MPI_Fint *ierr);
typedef void (*init_thread_fn)(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr);
typedef void (*allreduce_fn)(void *sb, void *rb, MPI_Fint *count, MPI_Fint *dt, MPI_Fint *op, MPI_Fint *comm,
                             MPI_Fint *ierr);

/* ierr may be NULL: mpi_f08's ierror is optional (absent: a null pointer). */
static void init(int spelling, MPI_Fint *ierr) {
    MPI_Fint own;
    if (!ierr) ierr = &own;
    dgc_mpi_check_abi("MPI_INIT");
    ((init_fn)real(NAME_INIT, spelling))(ierr);
    if (*ierr == MPI_SUCCESS) dgc_mpi_setup();
}

static void init_thread(int spelling, MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr) {
    MPI_Fint own;
    if (!ierr) ierr = &own;
    dgc_mpi_check_abi("MPI_INIT_THREAD");
    ((init_thread_fn)real(NAME_INIT_THREAD, spelling))(required, provided, ierr);
    if (*ierr == MPI_SUCCESS) dgc_mpi_setup();
}

/* The compressed path's result, or DGC_MPI_PASS. MPICH's Fortran bindings
 * (and those of the libraries that keep its ABI) call the C MPI_Allreduce,
 * where the shim sees the call: they pass straight on. */
static int try_fortran(void *sb, void *rb, const MPI_Fint *count, const MPI_Fint *dt, const MPI_Fint *op,
                       const MPI_Fint *comm) {
#if defined(MPICH_VERSION)
    (void)sb, (void)rb, (void)count, (void)dt, (void)op, (void)comm;
    return DGC_MPI_PASS;
#endif
    if (!dgc_config_current()->enable) return DGC_MPI_PASS;
    look_up_sentinels();
    void *in_place = dgc_registry_slot(SLOT_IN_PLACE), *bottom = dgc_registry_slot(SLOT_BOTTOM);
    if (!in_place || sb == bottom || rb == bottom || rb == in_place) return DGC_MPI_PASS;
    const void *c_sb = sb == in_place ? MPI_IN_PLACE : sb;
    return dgc_mpi_try_compressed(c_sb, rb, *count, PMPI_Type_f2c(*dt), PMPI_Op_f2c(*op), PMPI_Comm_f2c(*comm));
}

static void allreduce(int spelling, void *sb, void *rb, MPI_Fint *count, MPI_Fint *dt, MPI_Fint *op, MPI_Fint *comm,
                      MPI_Fint *ierr) {
    int rc = try_fortran(sb, rb, count, dt, op, comm);
    if (rc == DGC_MPI_PASS) ((allreduce_fn)real(NAME_ALLREDUCE, spelling))(sb, rb, count, dt, op, comm, ierr);
    else *ierr = rc;
}

/* One definition per spelling. */
#define INIT_AS(name, spelling) \
    DGC_MPI_EXPORT void name(MPI_Fint *ierr) { init(spelling, ierr); }
#define INIT_THREAD_AS(name, spelling) \
    DGC_MPI_EXPORT void name(MPI_Fint *required, MPI_Fint *provided, MPI_Fint *ierr) { \
        init_thread(spelling, required, provided, ierr); \
    }
#define ALLREDUCE_AS(name, spelling) \
    DGC_MPI_EXPORT void name(void *sb, void *rb, MPI_Fint *count, MPI_Fint *dt, MPI_Fint *op, MPI_Fint *comm, \
                     MPI_Fint *ierr) { \
        allreduce(spelling, sb, rb, count, dt, op, comm, ierr); \
    }

/* Prototypes, so that -Wmissing-declarations stays quiet and the names are
 * listed once more for the reader. */
void mpi_init_(MPI_Fint *), mpi_init__(MPI_Fint *), mpi_init(MPI_Fint *), MPI_INIT(MPI_Fint *),
    ompi_init_f(MPI_Fint *), mpi_init_f08_(MPI_Fint *);
void mpi_init_thread_(MPI_Fint *, MPI_Fint *, MPI_Fint *), mpi_init_thread__(MPI_Fint *, MPI_Fint *, MPI_Fint *),
    mpi_init_thread(MPI_Fint *, MPI_Fint *, MPI_Fint *), MPI_INIT_THREAD(MPI_Fint *, MPI_Fint *, MPI_Fint *),
    ompi_init_thread_f(MPI_Fint *, MPI_Fint *, MPI_Fint *), mpi_init_thread_f08_(MPI_Fint *, MPI_Fint *, MPI_Fint *);
#define ALLREDUCE_ARGS void *, void *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *, MPI_Fint *
void mpi_allreduce_(ALLREDUCE_ARGS), mpi_allreduce__(ALLREDUCE_ARGS), mpi_allreduce(ALLREDUCE_ARGS),
    MPI_ALLREDUCE(ALLREDUCE_ARGS), ompi_allreduce_f(ALLREDUCE_ARGS);

INIT_AS(mpi_init_, 0)
INIT_AS(mpi_init__, 1)
INIT_AS(mpi_init, 2)
INIT_AS(MPI_INIT, 3)
INIT_AS(ompi_init_f, 4)
INIT_AS(mpi_init_f08_, 5)
INIT_THREAD_AS(mpi_init_thread_, 0)
INIT_THREAD_AS(mpi_init_thread__, 1)
INIT_THREAD_AS(mpi_init_thread, 2)
INIT_THREAD_AS(MPI_INIT_THREAD, 3)
INIT_THREAD_AS(ompi_init_thread_f, 4)
INIT_THREAD_AS(mpi_init_thread_f08_, 5)
ALLREDUCE_AS(mpi_allreduce_, 0)
ALLREDUCE_AS(mpi_allreduce__, 1)
ALLREDUCE_AS(mpi_allreduce, 2)
ALLREDUCE_AS(MPI_ALLREDUCE, 3)
ALLREDUCE_AS(ompi_allreduce_f, 4)

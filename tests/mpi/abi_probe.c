/* A program of the other MPI family than the shim's build, for
 * mpi.abi_mismatch (tests/mpi/abi_mismatch.sh compiles it with that
 * family's mpicc). Two ways in:
 *   abi_probe            linked with its MPI: the shim must stop it at load
 *   abi_probe dlopen LIB not linked with any MPI: it loads LIB later, as
 *                        mpi4py does, and calls MPI_Init: the shim must stop
 *                        it there, before MPI starts
 * Either way, reaching the end means two MPI ABIs ran in one process. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#ifdef PROBE_LINKED
#include <mpi.h>
#endif

int main(int argc, char **argv) {
#ifdef PROBE_LINKED
    (void)argc, (void)argv;
    MPI_Init(NULL, NULL);
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("REACHED the end: MPI_Init ran (size %d)\n", size);
    MPI_Finalize();
#else
    if (argc < 3 || strcmp(argv[1], "dlopen") != 0) {
        fprintf(stderr, "usage: abi_probe dlopen LIBMPI\n");
        return 2;
    }
    if (!dlopen(argv[2], RTLD_NOW | RTLD_GLOBAL)) {
        fprintf(stderr, "cannot load %s: %s\n", argv[2], dlerror());
        return 2;
    }
    int (*init)(int *, char ***) = (int (*)(int *, char ***))dlsym(RTLD_DEFAULT, "MPI_Init");
    if (!init) {
        fprintf(stderr, "no MPI_Init\n");
        return 2;
    }
    init(NULL, NULL);
    printf("REACHED the end: MPI_Init ran\n");
#endif
    return 0;
}

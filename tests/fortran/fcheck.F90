! A Fortran MPI program run under LD_PRELOAD=libdgcshim.so, built three times:
! with mpif.h (-DUSE_MPIFH), `use mpi` (-DUSE_MPI) and `use mpi_f08` (-DUSE_F08).
! Open MPI's Fortran bindings call PMPI_Init and PMPI_Allreduce directly, so
! the shim must intercept the Fortran entry points for any of this to be
! compressed.
!
! Each rank's gradient is small everywhere (1e-3 at most) except in a block
! of k = 400 elements of its own, which hold 1 + rank. At DGC_SPARSITY=0.99
! (k = 400 of 40000) and fresh state the shim sends exactly those blocks, so
! the output holds 1 + r in rank r's block and exact zeros elsewhere; a dense
! all-reduce would sum the small values there. Checked: MPI_REAL from two
! buffers, MPI_IN_PLACE, and a duplicate communicator freed with
! MPI_COMM_FREE (from Fortran, which calls PMPI_Comm_free): the next
! duplicate starts from fresh state.
program fcheck
#if defined(USE_F08)
  use mpi_f08
#elif defined(USE_MPI)
  use mpi
#endif
  implicit none
#if defined(USE_MPIFH)
  include 'mpif.h'
#endif
#if defined(USE_F08)
  type(MPI_Comm) :: dup
#else
  integer :: dup
#endif
  integer, parameter :: n = 40000, k = 400
  real(4), allocatable :: g(:), out(:)
  integer :: ierr, rank, nranks, i

  allocate(g(n), out(n))
  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  if (nranks * k > n) call fail('too many ranks for the blocks')
  do i = 1, n
    g(i) = 1.0e-3 * real(mod(7 * i + rank, 13) + 1) / 13.0
  end do
  do i = 1, k
    g(rank * k + i) = real(1 + rank)
  end do

  call MPI_Allreduce(g, out, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call expect_blocks('MPI_Allreduce of MPI_REAL')

  out = g
  call MPI_Allreduce(MPI_IN_PLACE, out, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call expect_blocks('MPI_Allreduce with MPI_IN_PLACE')

  call MPI_Comm_dup(MPI_COMM_WORLD, dup, ierr)
  call MPI_Allreduce(g, out, n, MPI_REAL, MPI_SUM, dup, ierr)
  call expect_blocks('MPI_Allreduce on a duplicate')
  call MPI_Comm_free(dup, ierr)
  ! Same buffers, a new duplicate, a zero gradient: fresh state sends
  ! nothing; the freed communicator's residual (the small values) would.
  call MPI_Comm_dup(MPI_COMM_WORLD, dup, ierr)
  g = 0.0
  call MPI_Allreduce(g, out, n, MPI_REAL, MPI_SUM, dup, ierr)
  if (any(out /= 0.0)) call fail('a freed communicator''s state carried over to the next duplicate')
  call MPI_Comm_free(dup, ierr)

  if (ierr /= MPI_SUCCESS) call fail('an MPI call failed')
  if (rank == 0) print '(a)', 'PASS fortran'
  call MPI_Finalize(ierr)

contains

  subroutine expect_blocks(what)
    character(*), intent(in) :: what
    integer :: j, owner
    real(4) :: want
    do j = 1, n
      owner = (j - 1) / k
      want = 0.0
      if (owner < nranks) want = real(1 + owner)
      if (out(j) /= want) then
        print '(a,a,a,i0,a,es14.6,a,es14.6)', 'FAIL ', what, ': element ', j, ' is ', out(j), ', want ', want
        call fail('not the compressed result')
      end if
    end do
  end subroutine

  subroutine fail(why)
    character(*), intent(in) :: why
    integer :: e
    print '(a,i0,a,a)', 'FAIL rank ', rank, ': ', why
    call MPI_Abort(MPI_COMM_WORLD, 1, e)
  end subroutine
end program

/* The node layout on the NCCL path: each rank's node, the layout found at
 * the configuration check, and the node and cross communicators.
 *
 * The layout follows the MPI path's (shim/mpi/node.c): M nodes of L ranks
 * each; node holds the L ranks of one node, by rank; cross the M ranks of
 * one local rank, one per node, nodes in the order of their lowest rank
 * (rules.c, dgc_nccl_layout_of). It is found from a word every rank adds to
 * the configuration check's all-gather (agree.c): its node, from
 * DGC_NODE_SIZE (L consecutive ranks), else a hash of NCCL_HOSTID or of the
 * host's name and boot id, as NCCL tells its own hosts apart. So every rank
 * holds the same layout, and finding it costs no collective of its own.
 *
 * The two communicators are NCCL children of the program's (ncclCommSplit,
 * NCCL 2.18 and later, called on the real NCCL: the program never sees
 * them), made right after a passing check: where NCCL made the
 * communicator, or at its first candidate call outside any group and
 * capture (a non-blocking one, or one made by a constructor the shim does
 * not interpose). Every rank splits there, whatever its memory, since the
 * split is collective; a byte all-gathered over the parent then says
 * whether every rank got both children, and if one did not, every rank
 * aborts what it got and the communicator stays flat, said once. They end
 * with their parent (nccl/destroy.c: destroyed with it, or aborted first
 * when it is aborted, from any thread).
 *
 * The cross child has a record of its own (its shards' states, report and
 * votes); a call in node layout (nccl/node.c) uses both children. They are
 * made under DGC_TOPOLOGY=auto (the default) and node, as on the MPI path;
 * where the layout cannot hold, node says why as a warning, auto at debug
 * level (docs/topology.md, "The NCCL path"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "internal.h"

/* FNV-1a, 64 bits, continued from h. */
static uint64_t fnv(uint64_t h, const char *s, size_t len) {
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* The host's boot id (a machine's identity that a container shares with
 * its host's other containers only when they share its kernel: the same
 * rule as NCCL's). Empty when it cannot be read. */
static size_t boot_id(char *buf, size_t len) {
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return 0;
    size_t got = fread(buf, 1, len - 1, f);
    fclose(f);
    while (got && (buf[got - 1] == '\n' || buf[got - 1] == ' ')) got--;
    buf[got] = '\0';
    return got;
}

uint64_t dgc_nccl_node_id(const dgc_config *cfg, int rank) {
    if (cfg->node_size) return (uint64_t)rank / cfg->node_size;
    uint64_t h = 14695981039346656037ull;
    const char *hostid = getenv("NCCL_HOSTID");
    if (hostid && *hostid) return fnv(h, hostid, strlen(hostid));
    char name[256] = "", boot[64] = "";
    if (gethostname(name, sizeof name - 1) != 0) name[0] = '\0';
    h = fnv(h, name, strlen(name));
    return fnv(h, boot, boot_id(boot, sizeof boot));
}

void dgc_nccl_layout_note(dgc_nccl_comm *x, const uint64_t *ids, int stride) {
    x->flat_why = dgc_nccl_layout_of(ids, x->nranks, stride, x->rank, &x->layout, &x->node_index);
}

/* Why the communicator stays flat, on rank 0: a warning where
 * DGC_TOPOLOGY=node asked for the node layout, else at debug level. */
static void say_flat(const dgc_nccl_comm *x, const dgc_config *cfg, const char *why) {
    if (x->rank != 0) return;
    if (cfg->topology == DGC_TOPOLOGY_NODE)
        DGC_WARN("DGC_TOPOLOGY=node: an NCCL communicator of %d ranks stays flat: %s", x->nranks, why);
    else
        DGC_DEBUG("an NCCL communicator of %d ranks is flat: %s", x->nranks, why);
}

/* One child: ncclCommSplit of the parent, settled when the parent is
 * non-blocking (the child inherits its config). NULL when it failed. */
static ncclComm_t split(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t parent, int color, int key) {
    ncclComm_t child = NULL;
    ncclResult_t rc = api->comm_split(parent, color, key, &child, NULL);
    if (rc == ncclInProgress && child) rc = dgc_nccl_settle(api, c, child, rc);
    if (rc == ncclSuccess && child) return child;
    if (child) api->comm_abort(child);
    DGC_DEBUG("ncclCommSplit (color %d, key %d) failed: %d", color, key, (int)rc);
    return NULL;
}

/* Every rank's byte (1: it has both children) over the parent (nccl/vote.c);
 * the smallest in *all. */
static ncclResult_t agree_all(const dgc_nccl_api *api, dgc_comm *c, ncclComm_t comm, cudaStream_t stream, int mine,
                              int *all) {
    const ncclResult_t rc =
        dgc_nccl_vote_collect(api, c, comm, stream, dgc_nccl_vote_issue(api, c, comm, stream, (unsigned char)mine));
    const unsigned char *votes = dgc_nccl_ext(c)->votes_host;
    *all = rc == ncclSuccess;
    for (int r = 0; *all && r < c->nranks; r++) *all = votes[r] != 0;
    return rc;
}

/* The cross child's record: its shards' states, its own report and
 * votes, as any communicator's (its check is the parent's). */
static dgc_comm *open_cross(const dgc_nccl_api *api, dgc_nccl_comm *x, ncclComm_t cross) {
    dgc_comm *cc = cross ? dgc_nccl_comm_open(api, cross, x->device) : NULL;
    if (cc) cc->check = DGC_CHECK_PASSED;
    return cc;
}

/* Ends what make_pair made on this rank when not every rank made it. */
static void abort_pair(const dgc_nccl_api *api, ncclComm_t node, ncclComm_t cross, dgc_comm *cc) {
    if (cc) {
        dgc_registry_comm_drop(cc);
        dgc_registry_comm_close(dgc_registry_comm_unbind(cross));
    }
    if (node) api->comm_abort(node);
    if (cross) api->comm_abort(cross);
}

/* Both children of one checked communicator and the cross record, or
 * none. */
static void make_pair(const dgc_nccl_api *api, dgc_nccl_check *k, const dgc_config *cfg) {
    dgc_nccl_comm *x = dgc_nccl_ext(k->c);
    ncclComm_t node = split(api, k->c, k->comm, x->node_index, x->rank);
    ncclComm_t cross = split(api, k->c, k->comm, x->layout.local, x->node_index);
    dgc_comm *cc = node ? open_cross(api, x, cross) : NULL;
    int all = 0;
    const ncclResult_t rc = agree_all(api, k->c, k->comm, k->stream, node && cc, &all);
    if (rc != ncclSuccess || !all) {
        abort_pair(api, node, cross, cc);
        say_flat(x, cfg, rc != ncclSuccess ? "the agreement on its node and cross communicators failed"
                                           : "a rank's ncclCommSplit (or the cross record) failed");
        return;
    }
    x->node_comm = node;
    x->cross_comm = cross; /* its record is bound to it: node calls hold it by the handle */
    dgc_registry_comm_drop(cc);
    if (x->rank == 0)
        DGC_INFO("an NCCL communicator of %d ranks is in node layout, %d nodes of %d ranks (%s): its sums and averages "
                 "(fp32, fp16, bf16) go by it",
                 x->nranks, x->layout.nodes, x->layout.node_size, cfg->node_size ? "DGC_NODE_SIZE" : "host names");
}

void dgc_nccl_children_make(const dgc_nccl_api *api, dgc_nccl_check *k, int n, const dgc_config *cfg) {
    for (int i = 0; i < n; i++) {
        if (k[i].c->check != DGC_CHECK_PASSED || !cfg->enable || cfg->topology == DGC_TOPOLOGY_FLAT) continue;
        dgc_nccl_comm *x = dgc_nccl_ext(k[i].c);
        if (x->node_comm || x->cross_comm) continue; /* made already (a check is run once) */
        const char *why = x->flat_why;
        if (!why && n > 1)
            why = "it was made with other communicators by one thread (ncclCommInitAll, or a group)";
        else if (!why && (!api->comm_split || !api->send || !api->recv || !api->broadcast))
            why = "this NCCL lacks ncclCommSplit (2.18 and later), ncclSend, ncclRecv or ncclBroadcast";
        if (why) {
            say_flat(x, cfg, why);
            continue;
        }
        if (dgc_device_switch(x->device) == 0) make_pair(api, &k[i], cfg);
    }
}

/* Takes a child out of the record first, so that whatever runs next sees
 * none, then ends it. */
static void end_one(const dgc_nccl_api *api, ncclComm_t *slot, int abort) {
    ncclComm_t child = __atomic_exchange_n(slot, NULL, __ATOMIC_ACQ_REL);
    if (!child) return;
    const ncclResult_t rc = abort ? api->comm_abort(child) : api->comm_destroy(child);
    if (rc != ncclSuccess) DGC_DEBUG("a node layout's %s of a child communicator said %d", abort ? "abort" : "destroy",
                                     (int)rc);
}

void dgc_nccl_children_end(const dgc_nccl_api *api, dgc_nccl_comm *x, int abort) {
    /* The cross record first: its states' frees go in stream order before
     * its communicator ends. The unbind answers one thread only. */
    const ncclComm_t cross = __atomic_load_n(&x->cross_comm, __ATOMIC_ACQUIRE);
    if (cross) {
        dgc_device_guard g;
        const int ok = dgc_device_enter(&g, x->device) == 0;
        const uint64_t id = dgc_registry_comm_unbind(cross);
        if (id) dgc_registry_comm_close(id);
        if (ok) dgc_device_leave(&g);
    }
    end_one(api, &x->node_comm, abort);
    end_one(api, &x->cross_comm, abort);
}

/*
 * migrate_internal.h - what the migration files of src/engine share: the
 * migration plan object (migration.c builds it, execute.c runs it). The
 * relabelling and move limits they build on are the planner's
 * (src/plan/constrain.h). Internal.
 */
#ifndef EPX_MIGRATE_INTERNAL_H
#define EPX_MIGRATE_INTERNAL_H

#include "../plan/constrain.h"

/* A migration plan (migration.c builds it, execute.c runs it). */
struct epx_migration {
    epx_shape shape;
    epx_layout *layout; /* the relabelled target */
    int32_t *current;   /* [L][P] the layout it starts from, to check the caller's */
    uint8_t *failed;    /* [G] nonzero = failed */
    int32_t *perm;      /* [L][P] */
    uint8_t *kinds;     /* [L][P] epx_move_kind */
    int32_t *src;       /* [L][P] */
    uint64_t *sent;     /* [G] bytes over links */
    uint64_t *recv;     /* [G] */
    epx_migration_stats stats;
    int64_t naive_loaded; /* naive slots whose expert no live GPU holds */
};

/* Refuses a layout with an expert whose every replica is on a failed GPU
 * (naming `what`, the layer, the expert and a GPU it is on); else sets *most
 * to the most live replicas of any expert. failed NULL: all live (live.c). */
EPXI_HIDDEN epx_status epxi_live_replicas_most(const epx_layout *layout, const uint8_t *failed,
                                               const char *what, int32_t *most, epx_error *err);

#endif

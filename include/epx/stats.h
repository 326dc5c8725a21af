/* epx/stats.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_STATS_H
#define EPX_STATS_H

#endif /* EPX_STATS_H */

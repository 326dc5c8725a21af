/* epx/plan.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_PLAN_H
#define EPX_PLAN_H

#endif /* EPX_PLAN_H */

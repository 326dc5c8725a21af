/* epx/moe.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_MOE_H
#define EPX_MOE_H

#endif /* EPX_MOE_H */

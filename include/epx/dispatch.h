/* epx/dispatch.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_DISPATCH_H
#define EPX_DISPATCH_H

#endif /* EPX_DISPATCH_H */

/* epx/pt.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_PT_H
#define EPX_PT_H

#endif /* EPX_PT_H */

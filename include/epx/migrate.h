/* epx/migrate.h - part of the core API; include epx.h, not this file. */
#ifndef EPX_MIGRATE_H
#define EPX_MIGRATE_H

#endif /* EPX_MIGRATE_H */

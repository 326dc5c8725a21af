/*
 * out.c - what every command does before and while it writes: all outputs
 * are checked before the first byte goes out (non-regular targets refused,
 * an output that is an input or another output refused, the folder
 * writable), so either every output is written or none is; and a small
 * signal-safe registry of temp names that SIGINT, SIGTERM and SIGHUP remove
 * before the process dies. The writing itself is the library's one safe
 * path (epx_file_write: temp file beside the target, rename).
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the temp registry ---------------------------------------------------
 * Fixed storage, filled before the temp exists: the handler only reads it
 * and calls unlink/rmdir, both async-signal-safe. */
enum { MAX_TEMPS = 32, TEMP_LEN = 4160 };
static char temps[MAX_TEMPS][TEMP_LEN];
static bool temp_is_dir[MAX_TEMPS];
static volatile sig_atomic_t num_temps;

static void on_signal(int sig) {
    /* Newest first: a folder's files go before the folder. */
    for (int i = (int)num_temps - 1; i >= 0; i--) {
        if (temp_is_dir[i])
            (void)rmdir(temps[i]);
        else
            (void)unlink(temps[i]);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_temp_register(const char *path, bool is_dir) {
    static bool installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
        installed = true;
    }
    if (num_temps >= MAX_TEMPS || strlen(path) >= TEMP_LEN) return;
    snprintf(temps[num_temps], TEMP_LEN, "%s", path);
    temp_is_dir[num_temps] = is_dir;
    num_temps = num_temps + 1;
}

/* ---- checks before writing ---------------------------------------------- */

typedef struct file_id {
    dev_t dev;
    ino_t ino;
    const char *base; /* a new name: (folder's dev+ino, base) identifies it */
    bool exists;
} file_id;

static bool same_id(const file_id *a, const file_id *b) {
    if (a->dev != b->dev || a->ino != b->ino || a->exists != b->exists) return false;
    return a->exists || strcmp(a->base, b->base) == 0;
}

/* The folder part of a resolved path ("." when none). */
static void dir_of(const char *p, char *dir, size_t cap) {
    const char *slash = strrchr(p, '/');
    if (slash == NULL)
        snprintf(dir, cap, ".");
    else
        snprintf(dir, cap, "%.*s", slash == p ? 1 : (int)(slash - p), p);
}

/* Whether path names the existing file (dev, ino); a folder is searched one
 * level deep, as --counts reads a folder of per-pass dumps. The file that
 * matched goes to hit. */
static bool file_or_folder_holds(const char *path, dev_t dev, ino_t ino, char *hit, size_t cap) {
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) {
        if (st.st_dev != dev || st.st_ino != ino) return false;
        snprintf(hit, cap, "%s", path);
        return true;
    }
    DIR *d = opendir(path);
    if (d == NULL) return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        found = stat(p, &st) == 0 && S_ISREG(st.st_mode) && st.st_dev == dev && st.st_ino == ino;
        if (found) snprintf(hit, cap, "%s", p);
    }
    closedir(d);
    return found;
}

/* Whether input `in` holds the file (dev, ino): the path itself, a folder's
 * files, or each item of a comma list (per-pass dumps: r0.pt,r1.pt). */
static bool input_holds(const char *in, dev_t dev, ino_t ino, char *hit, size_t cap) {
    if (file_or_folder_holds(in, dev, ino, hit, cap)) return true;
    if (strchr(in, ',') == NULL) return false;
    char *list = strdup(in), *save = NULL;
    bool found = false;
    for (char *item = list ? strtok_r(list, ",", &save) : NULL; item && !found;
         item = strtok_r(NULL, ",", &save))
        found = file_or_folder_holds(item, dev, ino, hit, cap);
    free(list);
    return found;
}

/* Whether the output's folder takes a new file: the temp name the writer
 * will use, made and removed (registered for the signals first). access()
 * cannot tell: it says yes to root in /proc, where nothing can be made, and
 * the command failed only after its work. An existing temp name (a killed
 * run's with our pid) is left to the writer, which replaces it. -1 when the
 * folder takes it, else CLI_EXIT_USAGE after saying why. */
static int probe_folder(const cli_cmd *cmd, const char *path, const char *target) {
    char tmp[TEMP_LEN], dir[4096];
    epx_error err = {0};
    if (epx_file_temp_path(target, tmp, sizeof tmp, &err) != EPX_OK) return -1; /* writer says */
    cli_temp_register(tmp, false);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    } else if (errno != EEXIST) {
        dir_of(target, dir, sizeof dir);
        fprintf(stderr,
                "epx %s: cannot write '%s': no file can be made in folder '%s' (%s); choose "
                "another path\n",
                cmd->name, path, dir, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    return -1;
}

/* Whether a path names a process's open file rather than a file: standard
 * output and its kin (/dev/stdout, /dev/fd/N, /proc/self/fd/N). Written
 * atomically (a temp file renamed over it), such an output fails with "no
 * file can be made in folder '/proc/self/fd'" on a pipe, and on a redirect
 * replaces the shell's file behind its back. (/dev/shm and other folders
 * under /dev hold real files: not these.) */
static bool is_stream_path(const char *p) {
    if (strcmp(p, "/dev/stdout") == 0 || strcmp(p, "/dev/stderr") == 0 ||
        strcmp(p, "/dev/stdin") == 0 || strncmp(p, "/dev/fd/", 8) == 0)
        return true;
    if (strncmp(p, "/proc/", 6) != 0) return false;
    const char *fd = strchr(p + 6, '/');
    return fd != NULL && strncmp(fd, "/fd/", 4) == 0;
}

int cli_outputs_check(const cli_cmd *cmd, const char *const *in, int nin, const cli_out *out,
                      int nout) {
    char *target[16] = {0};
    file_id id[16];
    int rc = -1;
    if (nout > 16) nout = 16;
    for (int i = 0; i < nout && rc < 0; i++) {
        const char *p = out[i].path;
        if (p == NULL) continue;
        if (strcmp(p, "-") == 0) { /* standard output: only the JSON lines take it */
            if (out[i].append) continue;
            fprintf(stderr,
                    "epx %s: '-' names no file here: this output is written to a file (atomically, "
                    "via a temp file); give a file name\n",
                    cmd->name);
            rc = CLI_EXIT_USAGE;
            break;
        }
        epx_error err = {0};
        /* (an appended output is opened as it is: a stream takes it) */
        if (!out[i].append && is_stream_path(p)) {
            fprintf(stderr,
                    "epx %s: output '%s' is a stream (standard output or an open file), not a "
                    "file: this output is written to a file (atomically, via a temp file); give "
                    "a file path, then read it with cat\n",
                    cmd->name, p);
            rc = CLI_EXIT_USAGE;
            break;
        }
        if (epx_file_output_check(p, &target[i], &err) != EPX_OK) {
            fprintf(stderr, "epx %s: %s\n", cmd->name, err.msg);
            rc = CLI_EXIT_USAGE;
            break;
        }
        if (!out[i].append && is_stream_path(target[i])) { /* a link to one */
            fprintf(stderr,
                    "epx %s: output '%s' leads to '%s', a stream (standard output or an open "
                    "file), not a file: give a file path\n",
                    cmd->name, p, target[i]);
            rc = CLI_EXIT_USAGE;
            break;
        }
        char dir[4096];
        dir_of(target[i], dir, sizeof dir);
        struct stat st;
        if (stat(target[i], &st) == 0) {
            id[i] = (file_id){st.st_dev, st.st_ino, NULL, true};
            if (out[i].append && access(target[i], W_OK) != 0) {
                fprintf(stderr, "epx %s: cannot append to '%s': %s; choose another file\n",
                        cmd->name, p, strerror(errno));
                rc = CLI_EXIT_USAGE;
            }
        } else {
            struct stat ds;
            const char *slash = strrchr(target[i], '/');
            id[i] = (file_id){0, 0, slash ? slash + 1 : target[i], false};
            if (stat(dir, &ds) == 0) {
                id[i].dev = ds.st_dev;
                id[i].ino = ds.st_ino;
            }
        }
        if (rc < 0 && !out[i].append) rc = probe_folder(cmd, p, target[i]);
        for (int j = 0; rc < 0 && id[i].exists && j < nin; j++) {
            char hit[4400];
            if (in[j] == NULL || !input_holds(in[j], id[i].dev, id[i].ino, hit, sizeof hit))
                continue;
            if (strcmp(hit, in[j]) == 0)
                fprintf(stderr,
                        "epx %s: output '%s' is the input '%s' (the same file); write to "
                        "another path\n",
                        cmd->name, p, in[j]);
            else
                fprintf(stderr,
                        "epx %s: output '%s' is the input '%s' (the same file, read as part of "
                        "'%s'); write to another path\n",
                        cmd->name, p, hit, in[j]);
            rc = CLI_EXIT_USAGE;
        }
        for (int j = 0; rc < 0 && j < i; j++) {
            if (target[j] == NULL || !same_id(&id[i], &id[j])) continue;
            fprintf(stderr, "epx %s: outputs '%s' and '%s' are the same file; give two paths\n",
                    cmd->name, out[j].path, p);
            rc = CLI_EXIT_USAGE;
        }
    }
    /* (the temp names were registered for the signals by probe_folder) */
    for (int i = 0; i < nout; i++) epx_free(target[i]);
    return rc;
}

bool cli_is_pt(const char *path) {
    size_t n = path ? strlen(path) : 0;
    return n >= 3 && strcmp(path + n - 3, ".pt") == 0;
}

bool cli_json_only(const cli_cmd *cmd, const char *opt, const char *path, const char *what) {
    if (!cli_is_pt(path)) return true;
    fprintf(stderr,
            "epx %s: %s '%s': %s is written as JSON only (a .pt name says PyTorch's format, "
            "which a reader such as SGLang's torch.load would then fail on): name it .json\n",
            cmd->name, opt, path, what);
    return false;
}

int cli_write_failed(const cli_cmd *cmd, const epx_error *err) {
    /* The outputs were checked first, so an I/O error now (a full disk) is
     * a runtime failure, not bad input. */
    if (err->status == EPX_ERR_IO) {
        fprintf(stderr, "epx %s: %s\n", cmd->name, err->msg);
        return CLI_EXIT_FAIL;
    }
    return cli_report(cmd, err);
}

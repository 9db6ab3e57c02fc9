// slowfs: a FUSE filesystem for tests that serves a directory read-only as a
// slow network filesystem would, and counts, independently of whoever
// reads, every byte read from each file.
//
//   slowfs SOURCE MOUNTPOINT [--latency-ms N] [--bandwidth-mib N]
//          [--direct-io-suffix S] [FUSE options, e.g. -f]
//
// Each read request waits `latency-ms`, then as long as `bandwidth-mib`
// MiB/s allows for its bytes. Files whose name ends in S bypass the kernel's
// page cache (every read reaches slowfs and is counted; such files cannot be
// memory-mapped).
//
// Control: the virtual file MOUNTPOINT/.slowfs. Reading it gives JSON:
//   {"latency_ms": N, "bandwidth_mib": N, "hang": 0|1,
//    "files": {"/a.bin": {"bytes": N, "reads": N}, ...}}
// Writing one of these lines changes behaviour at once:
//   latency_ms=N   bandwidth_mib=N   hang=1 (reads block until hang=0)
//   hang=0         reset (zero the counters)
//   fail=/PATH     (reads of that file fail with EIO; "fail=" to stop)
// Multithreaded, so the control file answers while reads hang.

#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CONTROL "/.slowfs"
#define MAX_FILES 1024

struct counted_file {
  char path[512];
  unsigned long long bytes;
  unsigned long long reads;
};

static struct {
  char* source;
  char* direct_io_suffix;
  double latency_ms;
  double bandwidth_mib;  // 0: unlimited
  int hang;
  char failing[512];  // reads of this path return EIO; "" for none
  pthread_mutex_t mutex;
  pthread_cond_t unhung;
  struct counted_file files[MAX_FILES];
  int num_files;
} fs = {.mutex = PTHREAD_MUTEX_INITIALIZER, .unhung = PTHREAD_COND_INITIALIZER};

struct options {
  const char* latency_ms;
  const char* bandwidth_mib;
  const char* direct_io_suffix;
};
#define OPTION(t, p) \
  { t, offsetof(struct options, p), 1 }
static const struct fuse_opt option_spec[] = {
    OPTION("--latency-ms=%s", latency_ms), OPTION("--bandwidth-mib=%s", bandwidth_mib),
    OPTION("--direct-io-suffix=%s", direct_io_suffix), FUSE_OPT_END};

static void source_path(char* out, size_t size, const char* path) {
  snprintf(out, size, "%s%s", fs.source, path);
}

static void sleep_seconds(double seconds) {
  if (seconds <= 0) return;
  struct timespec t = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// The control file's current text.
static size_t render_control(char* out, size_t size) {
  pthread_mutex_lock(&fs.mutex);
  size_t n = (size_t)snprintf(out, size,
                              "{\"latency_ms\": %g, \"bandwidth_mib\": %g, \"hang\": %d, "
                              "\"files\": {",
                              fs.latency_ms, fs.bandwidth_mib, fs.hang);
  for (int i = 0; i < fs.num_files && n < size; ++i) {
    n += (size_t)snprintf(out + n, size - n, "%s\"%s\": {\"bytes\": %llu, \"reads\": %llu}",
                          i == 0 ? "" : ", ", fs.files[i].path, fs.files[i].bytes,
                          fs.files[i].reads);
  }
  if (n < size) n += (size_t)snprintf(out + n, size - n, "}}\n");
  pthread_mutex_unlock(&fs.mutex);
  return n < size ? n : size;
}

static int slowfs_getattr(const char* path, struct stat* st, struct fuse_file_info* fi) {
  (void)fi;
  if (strcmp(path, CONTROL) == 0) {
    memset(st, 0, sizeof(*st));
    st->st_mode = S_IFREG | 0666;
    st->st_nlink = 1;
    st->st_size = 1 << 20;
    return 0;
  }
  char real[4096];
  source_path(real, sizeof(real), path);
  return lstat(real, st) == 0 ? 0 : -errno;
}

static int slowfs_readdir(const char* path, void* buf, fuse_fill_dir_t filler, off_t offset,
                          struct fuse_file_info* fi, enum fuse_readdir_flags flags) {
  (void)offset, (void)fi, (void)flags;
  char real[4096];
  source_path(real, sizeof(real), path);
  DIR* dir = opendir(real);
  if (dir == NULL) return -errno;
  for (struct dirent* e; (e = readdir(dir)) != NULL;) filler(buf, e->d_name, NULL, 0, 0);
  closedir(dir);
  return 0;
}

static int ends_with(const char* s, const char* suffix) {
  const size_t a = strlen(s), b = strlen(suffix);
  return b > 0 && a >= b && strcmp(s + a - b, suffix) == 0;
}

static int slowfs_open(const char* path, struct fuse_file_info* fi) {
  if (strcmp(path, CONTROL) == 0) {
    fi->direct_io = 1;
    return 0;
  }
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return -EROFS;
  char real[4096];
  source_path(real, sizeof(real), path);
  const int fd = open(real, O_RDONLY);
  if (fd < 0) return -errno;
  fi->fh = (uint64_t)fd;
  if (fs.direct_io_suffix != NULL && ends_with(path, fs.direct_io_suffix)) fi->direct_io = 1;
  return 0;
}

static struct counted_file* counter_of(const char* path) {
  for (int i = 0; i < fs.num_files; ++i) {
    if (strcmp(fs.files[i].path, path) == 0) return &fs.files[i];
  }
  if (fs.num_files == MAX_FILES) return NULL;
  struct counted_file* file = &fs.files[fs.num_files++];
  snprintf(file->path, sizeof(file->path), "%s", path);
  file->bytes = 0;  // the slot may hold counts from before a reset
  file->reads = 0;
  return file;
}

static int slowfs_read(const char* path, char* buf, size_t size, off_t offset,
                       struct fuse_file_info* fi) {
  if (strcmp(path, CONTROL) == 0) {
    char text[1 << 16];
    const size_t n = render_control(text, sizeof(text));
    if ((size_t)offset >= n) return 0;
    const size_t take = n - (size_t)offset < size ? n - (size_t)offset : size;
    memcpy(buf, text + offset, take);
    return (int)take;
  }
  pthread_mutex_lock(&fs.mutex);
  while (fs.hang) pthread_cond_wait(&fs.unhung, &fs.mutex);
  const double latency = fs.latency_ms / 1e3;
  const double bandwidth = fs.bandwidth_mib * 1024 * 1024;
  const int failing = strcmp(path, fs.failing) == 0;
  pthread_mutex_unlock(&fs.mutex);
  sleep_seconds(latency);
  if (failing) return -EIO;
  const ssize_t n = pread((int)fi->fh, buf, size, offset);
  if (n < 0) return -errno;
  if (bandwidth > 0) sleep_seconds((double)n / bandwidth);
  pthread_mutex_lock(&fs.mutex);
  struct counted_file* file = counter_of(path);
  if (file != NULL) {
    file->bytes += (unsigned long long)n;
    file->reads += 1;
  }
  pthread_mutex_unlock(&fs.mutex);
  return (int)n;
}

static int slowfs_write(const char* path, const char* buf, size_t size, off_t offset,
                        struct fuse_file_info* fi) {
  (void)offset, (void)fi;
  if (strcmp(path, CONTROL) != 0) return -EROFS;
  char line[256];
  snprintf(line, sizeof(line), "%.*s", (int)(size < sizeof(line) - 1 ? size : sizeof(line) - 1),
           buf);
  pthread_mutex_lock(&fs.mutex);
  double value = 0;
  int result = (int)size;
  if (sscanf(line, "latency_ms=%lf", &value) == 1) {
    fs.latency_ms = value;
  } else if (sscanf(line, "bandwidth_mib=%lf", &value) == 1) {
    fs.bandwidth_mib = value;
  } else if (sscanf(line, "hang=%lf", &value) == 1) {
    fs.hang = value != 0;
    if (!fs.hang) pthread_cond_broadcast(&fs.unhung);
  } else if (strncmp(line, "fail=", 5) == 0) {
    snprintf(fs.failing, sizeof(fs.failing), "%s", line + 5);
    fs.failing[strcspn(fs.failing, "\n")] = '\0';
  } else if (strncmp(line, "reset", 5) == 0) {
    fs.num_files = 0;
  } else {
    result = -EINVAL;
  }
  pthread_mutex_unlock(&fs.mutex);
  return result;
}

static int slowfs_truncate(const char* path, off_t size, struct fuse_file_info* fi) {
  (void)size, (void)fi;
  return strcmp(path, CONTROL) == 0 ? 0 : -EROFS;
}

static int slowfs_release(const char* path, struct fuse_file_info* fi) {
  if (strcmp(path, CONTROL) != 0) close((int)fi->fh);
  return 0;
}

static const struct fuse_operations operations = {
    .getattr = slowfs_getattr,
    .readdir = slowfs_readdir,
    .open = slowfs_open,
    .read = slowfs_read,
    .write = slowfs_write,
    .truncate = slowfs_truncate,
    .release = slowfs_release,
};

int main(int argc, char* argv[]) {
  struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
  struct options options = {0};
  if (fuse_opt_parse(&args, &options, option_spec, NULL) == -1) return 1;
  // The first non-option argument is the source directory; FUSE takes the rest.
  if (args.argc < 3) {
    fprintf(stderr,
            "usage: slowfs SOURCE MOUNTPOINT [--latency-ms=N] [--bandwidth-mib=N] "
            "[--direct-io-suffix=S] [-f]\n");
    return 2;
  }
  fs.source = realpath(args.argv[1], NULL);
  if (fs.source == NULL) {
    perror(args.argv[1]);
    return 2;
  }
  for (int i = 1; i + 1 < args.argc; ++i) args.argv[i] = args.argv[i + 1];
  args.argc -= 1;
  fs.latency_ms = options.latency_ms != NULL ? atof(options.latency_ms) : 0;
  fs.bandwidth_mib = options.bandwidth_mib != NULL ? atof(options.bandwidth_mib) : 0;
  fs.direct_io_suffix = (char*)options.direct_io_suffix;
  const int code = fuse_main(args.argc, args.argv, &operations, NULL);
  fuse_opt_free_args(&args);
  return code;
}

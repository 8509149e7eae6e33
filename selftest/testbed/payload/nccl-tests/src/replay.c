/*
 * nccl-tests stand-in (gpuhealth test bed): <test>_perf prints a real nccl-tests output
 * instead of running collectives on GPUs the bed does not have.
 *
 * Which recording: the key "nccl.<test>_perf" of the node's scenario file (the fake NVML's:
 * $FAKE_NVML_SCENARIO, else /etc/fake-nvml/scenario.conf; "key=value" lines, '#' comments,
 * the last line of a key wins) names a file of the replays/ folder next to this binary (make
 * copies them there) or an absolute path; without the key it is DEFAULT_REPLAY. The command
 * line (-b -e -f -g ...) is accepted and not interpreted. The program links against libnccl
 * and asks it for its version, so a node without NCCL fails like a real one; stderr says
 * which library and which recording, so the evidence log shows that this was a replay.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nccl.h>
#ifdef MPI_SUPPORT
#include <mpi.h>
#endif

#define DEFAULT_SCENARIO "/etc/fake-nvml/scenario.conf"

static char *trim(char *s)
{
    char *end;

    while (isspace((unsigned char)*s))
        s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

/* The scenario's value for key (the last one), or NULL. */
static int scenario_value(const char *key, char *out, size_t size)
{
    const char *path = getenv("FAKE_NVML_SCENARIO");
    FILE *file = fopen(path ? path : DEFAULT_SCENARIO, "r");
    char line[1024];
    int found = 0;

    if (!file)
        return 0;
    while (fgets(line, sizeof line, file)) {
        char *name = trim(line), *eq = strchr(name, '=');
        if (*name == '#' || !eq)
            continue;
        *eq = '\0';
        if (!strcmp(trim(name), key)) {
            snprintf(out, size, "%s", trim(eq + 1));
            found = 1;
        }
    }
    fclose(file);
    return found;
}

static int replay(const char *path)
{
    FILE *file = fopen(path, "r");
    char buffer[8192];
    size_t n;

    if (!file) {
        perror(path);
        return 1;
    }
    while ((n = fread(buffer, 1, sizeof buffer, file)) > 0)
        fwrite(buffer, 1, n, stdout);
    fclose(file);
    return 0;
}

int main(int argc, char **argv)
{
    char key[128], name[PATH_MAX], exe[PATH_MAX], path[2 * PATH_MAX + 16];
    ssize_t length;
    int version, rc;

#ifdef MPI_SUPPORT
    MPI_Init(&argc, &argv);
#endif
    (void)argc;
    (void)argv;
    if (ncclGetVersion(&version) != ncclSuccess) {
        fprintf(stderr, "%s: ncclGetVersion failed\n", TEST_NAME);
        return 1;
    }
    snprintf(key, sizeof key, "nccl.%s", TEST_NAME);
    if (!scenario_value(key, name, sizeof name))
        snprintf(name, sizeof name, "%s", DEFAULT_REPLAY);
    if (name[0] == '/') {
        snprintf(path, sizeof path, "%s", name);
    } else {
        length = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (length < 0) {
            perror("/proc/self/exe");
            return 1;
        }
        exe[length] = '\0';
        *strrchr(exe, '/') = '\0';
        snprintf(path, sizeof path, "%s/replays/%s", exe, name);
    }
    fprintf(stderr, "# gpuhealth test bed stand-in: NCCL %d.%d.%d (libnccl.so.2); replaying %s\n",
            version / 10000, version % 10000 / 100, version % 100, path);
    rc = replay(path);
#ifdef MPI_SUPPORT
    MPI_Finalize();
#endif
    return rc;
}

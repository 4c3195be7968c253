/* A static TCP probe, packed by the e2e suite into a local OCI image (no registry is reachable):
 * it proves `image = NAME` runs under the same enforcement as `image = host`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/socket.h>
int main(int argc, char **argv) {
    /* `probe plant FILE`: says whether FILE was there, then makes it (a named image's root is
     * the container's own: each run starts from the image). */
    if (argc == 3 && strcmp(argv[1], "plant") == 0) {
        int was = access(argv[2], F_OK) == 0;
        FILE *f = fopen(argv[2], "w");
        printf("%s\n", was ? "was there" : f ? "planted" : "cannot write");
        return f ? 0 : 1;
    }
    /* `probe certs FILE...`: how many PEM certificates each file holds (or that it is absent):
     * where clients of other distributions look for the system's roots. */
    if (argc >= 3 && strcmp(argv[1], "certs") == 0) {
        for (int i = 2; i < argc; i++) {
            FILE *f = fopen(argv[i], "r");
            if (!f) { printf("%s absent\n", argv[i]); continue; }
            char line[4096]; int n = 0;
            while (fgets(line, sizeof line, f)) n += strncmp(line, "-----BEGIN CERTIFICATE-----", 27) == 0;
            fclose(f);
            printf("%s %d\n", argv[i], n);
        }
        return 0;
    }
    if (argc != 3) { fprintf(stderr, "usage: probe IPV4 PORT | probe plant FILE | probe certs FILE...\n"); return 2; }
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) return 2;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = { .tv_sec = 3 };
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) { printf("%s:%s open\n", argv[1], argv[2]); return 0; }
    printf("%s:%s %s\n", argv[1], argv[2], errno == ECONNREFUSED ? "refused" : strerror(errno));
    return 1;
}

/* dt_test_json.h - reads a committed JSON fixture for MPI tests (any failure ends the job). */
#ifndef DT_TEST_JSON_H
#define DT_TEST_JSON_H

#include <cjson/cJSON.h>
#include <string.h>

#include "dt_test.h"

/* Reads and parses a JSON file. The build's absolute path of a fixture is tried first; where
 * the programs run from another copy of the tree (the GPU machine), $DT_TEST_REFERENCE_DIR holds
 * the fixture files and the file's name is looked up there. */
static inline cJSON* dt_test_load_json(const char* path) {
  FILE* f = fopen(path, "rb");
  const char* dir = getenv("DT_TEST_REFERENCE_DIR");
  if (f == NULL && dir != NULL) {
    const char* base = strrchr(path, '/');
    char alt[4096];
    snprintf(alt, sizeof alt, "%s/%s", dir, base ? base + 1 : path);
    f = fopen(alt, "rb");
  }
  DT_ASSERT_TRUE(f != NULL, "cannot open %s (nor in $DT_TEST_REFERENCE_DIR)", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* text = (char*)malloc((size_t)n + 1);
  DT_ASSERT_EQ(fread(text, 1, (size_t)n, f), n);
  text[n] = '\0';
  fclose(f);
  cJSON* j = cJSON_Parse(text);
  free(text);
  DT_ASSERT_TRUE(j != NULL, "bad JSON in %s", path);
  return j;
}

#endif

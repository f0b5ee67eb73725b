/* dt_test_json.h - reads a committed JSON fixture for MPI tests (any failure ends the job). */
#ifndef DT_TEST_JSON_H
#define DT_TEST_JSON_H

#include <cjson/cJSON.h>

#include "dt_test.h"

static inline cJSON* dt_test_load_json(const char* path) {
  FILE* f = fopen(path, "rb");
  DT_ASSERT_TRUE(f != NULL, "cannot open %s", path);
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

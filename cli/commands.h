// The pdserve subcommands. Each takes the arguments after its name and returns the exit code:
// 0 success, 1 runtime error, 2 usage error.
#ifndef PDSERVE_CLI_COMMANDS_H_
#define PDSERVE_CLI_COMMANDS_H_

namespace pdserve::cli {

int MakeModelCommand(int argc, char** argv);
int GenerateCommand(int argc, char** argv);
int KvCalcCommand(int argc, char** argv);
int BenchEngineCommand(int argc, char** argv);
int TokenizeCommand(int argc, char** argv);
int DetokenizeCommand(int argc, char** argv);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_COMMANDS_H_
